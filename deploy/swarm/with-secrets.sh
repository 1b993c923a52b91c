#!/bin/sh
# megha-with-secrets: run a command with the broker's user and password taken from Docker secrets.
#
#   megha-with-secrets COMMAND [ARG...]
#
# deploy/swarm/stack.yml mounts this file (a swarm config) in every container, as the start of its entrypoint.
# It reads the secrets amqp_user and amqp_password (files in /run/secrets, or in $SECRETS_DIR), then:
#   - where MEGHA_AMQP_URL is set (a Megha service), puts them into it: amqp://rabbitmq:5672/ becomes
#     amqp://USER:PASSWORD@rabbitmq:5672/ (the URL in the stack file names no user);
#   - otherwise (the broker) exports them as RABBITMQ_DEFAULT_USER and RABBITMQ_DEFAULT_PASS, the user RabbitMQ
#     creates on its first start,
# and replaces itself with COMMAND. The user may not be guest, and both must be URL-safe (letters, digits, - . _ ~:
# `openssl rand -hex 24` makes such a password), so they go into the URL as they are.
set -eu

die() {
  echo "megha-with-secrets: $*" >&2
  exit 2
}

secret() {
  file="${SECRETS_DIR:-/run/secrets}/$1"
  [ -r "$file" ] || die "no secret $1 ($file): create it with docker secret create and grant it to the service"
  value=$(cat "$file") # without the trailing newline `echo ... | docker secret create` adds
  case $value in
    '') die "secret $1 is empty" ;;
    *[!A-Za-z0-9._~-]*) die "secret $1 holds characters other than letters, digits and - . _ ~" ;;
  esac
  printf '%s' "$value"
}

[ $# -gt 0 ] || die "usage: megha-with-secrets COMMAND [ARG...]"
user=$(secret amqp_user)
password=$(secret amqp_password)
[ "$user" != guest ] || die "the broker user may not be guest"

if [ -n "${MEGHA_AMQP_URL:-}" ]; then
  case $MEGHA_AMQP_URL in
    amqp://* | amqps://*) ;;
    *) die "MEGHA_AMQP_URL=$MEGHA_AMQP_URL is not an amqp:// or amqps:// URL" ;;
  esac
  scheme=${MEGHA_AMQP_URL%%://*}
  address=${MEGHA_AMQP_URL#*://}
  case $address in
    *@*) die "MEGHA_AMQP_URL names a user already; the secrets give it" ;;
  esac
  export MEGHA_AMQP_URL="$scheme://$user:$password@$address"
else
  export RABBITMQ_DEFAULT_USER="$user" RABBITMQ_DEFAULT_PASS="$password"
fi
exec "$@"
