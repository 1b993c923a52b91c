#!/bin/sh
# Start RabbitMQ in the foreground as the rabbitmq user, with a configuration written from the environment.
#
# Users: from a definitions file (RabbitMQ's load_definitions, given as the compose demo and the swarm stack do in
# RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS: `-rabbit load_definitions "FILE"`; python -m megha.deploy.secrets makes
# one), and then RabbitMQ creates no default user; or the one user RABBITMQ_DEFAULT_USER / RABBITMQ_DEFAULT_PASS
# name, created on the first start and allowed in from other containers. Without either, RabbitMQ's built-in default
# account may log in from inside the container only.
set -eu
conf=/var/lib/rabbitmq/megha.conf
umask 077
{
  cat <<CONF
listeners.tcp.default = 5672
log.console = true
log.console.level = info
log.console.use_colors = off
log.file = false
CONF
  if [ -n "${RABBITMQ_DEFAULT_USER:-}" ] || [ -n "${RABBITMQ_DEFAULT_PASS:-}" ]; then
    if [ -z "${RABBITMQ_DEFAULT_USER:-}" ] || [ -z "${RABBITMQ_DEFAULT_PASS:-}" ]; then
      echo "rabbitmq-entrypoint: set both RABBITMQ_DEFAULT_USER and RABBITMQ_DEFAULT_PASS, or neither" >&2
      exit 2
    fi
    printf 'loopback_users = none\ndefault_user = %s\ndefault_pass = %s\n' \
      "$RABBITMQ_DEFAULT_USER" "$RABBITMQ_DEFAULT_PASS"
  fi
} >"$conf"
export RABBITMQ_CONFIG_FILE="$conf"
exec /usr/lib/rabbitmq/bin/rabbitmq-server "$@"
