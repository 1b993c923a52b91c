#!/bin/sh
# with-secrets.sh: make the swarm stack's secrets as Docker secrets (keeping them when they exist), then run a
# command, if given, such as the stack's deployment:
#
#   deploy/swarm/with-secrets.sh docker stack deploy --resolve-image never -c deploy/swarm/stack.yml megha
#
# The secrets are those of `python -m megha.deploy.secrets` (docs/security.md), made by the Megha image
# ($MEGHA_IMAGE, default megha:latest) in a temporary folder, for the run $MEGHA_RUN_ID (default swarm, as in
# stack.yml) with RabbitMQ at amqp://rabbitmq:5672/: the cluster secret, the API tokens, a RabbitMQ user per role
# (its URL) and RabbitMQ's definitions of them. Each becomes the Docker secret ${MEGHA_SECRETS:-megha}-<name>. Two
# are also kept in $MEGHA_KEEP_DIR (default ~/.megha), mode 0600: <MEGHA_SECRETS>-operator-token, the operator's
# API token (for the `megha` CLI: --token or MEGHA_API_TOKEN), and <MEGHA_SECRETS>-rabbitmq-admin-password, the password of the broker's
# administrator <run>-admin (management UI).
#
# Secrets that all exist are kept. Some existing without the others is an error: they come from one run of the
# generator (a password is in a user's URL and in RabbitMQ's definitions), and Docker gives no secret back to read;
# remove them (docker secret rm) to make new ones, with the stack removed first.
set -eu

die() {
  echo "with-secrets.sh: $*" >&2
  exit 2
}

prefix=${MEGHA_SECRETS:-megha}
image=${MEGHA_IMAGE:-megha:latest}
run_id=${MEGHA_RUN_ID:-swarm}
keep=${MEGHA_KEEP_DIR:-$HOME/.megha}
# The generator's files; the Docker secret of each is named after it, without .json.
files="cluster-secret api-tokens operator-token amqp-url-gm amqp-url-lm amqp-url-worker amqp-url-loadgen
rabbitmq-definitions.json"

command -v docker >/dev/null || die "docker is not installed"
present="" missing=""
for file in $files; do
  if docker secret inspect "$prefix-${file%.json}" >/dev/null 2>&1; then
    present="$present $prefix-${file%.json}"
  else
    missing="$missing $prefix-${file%.json}"
  fi
done

if [ -n "$missing" ] && [ -n "$present" ]; then
  die "secrets$present exist but not$missing: make them all at once (docker secret rm$present, then run this again)"
elif [ -n "$missing" ]; then
  folder=$(mktemp -d)
  if ! docker run --rm --user "$(id -u):$(id -g)" -v "$folder:/secrets" "$image" \
    python -m megha.deploy.secrets /secrets --run-id "$run_id" --broker amqp://rabbitmq:5672/; then
    rm -rf "$folder"
    die "the generator failed (is $image built? deploy/images/build.sh)"
  fi
  for file in $files; do
    docker secret create "$prefix-${file%.json}" "$folder/$file" >/dev/null || {
      rm -rf "$folder"
      die "docker secret create $prefix-${file%.json} failed (is this node a swarm manager?)"
    }
  done
  (umask 077 && mkdir -p "$keep" && cp "$folder/operator-token" "$keep/$prefix-operator-token" \
    && cp "$folder/amqp-password-admin" "$keep/$prefix-rabbitmq-admin-password")
  rm -rf "$folder"
  echo "with-secrets.sh: made the secrets $prefix-* for run $run_id; the operator's API token is in" \
    "$keep/$prefix-operator-token, the broker administrator's password in $keep/$prefix-rabbitmq-admin-password" >&2
else
  echo "with-secrets.sh: the secrets $prefix-* exist; kept" >&2
fi
[ $# -eq 0 ] || exec "$@"
