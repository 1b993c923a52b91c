#!/bin/sh
# with-secrets.sh: make the swarm stack's secrets as Docker secrets (keeping them when they exist), then run a
# command, if given, such as the stack's deployment:
#
#   deploy/swarm/with-secrets.sh docker stack deploy --resolve-image never -c deploy/swarm/stack.yml megha
#
# The secrets are those of `python -m megha.deploy.secrets` (docs/security.md), made by the Megha image
# ($MEGHA_IMAGE, default megha:latest) in a temporary folder, for the run $MEGHA_RUN_ID (default swarm, as in
# stack.yml) with RabbitMQ at amqp://rabbitmq:5672/: a folder per service of stack.yml holding exactly what that
# service reads (its own credential, the users' API tokens as digests, its role's broker URL, the operator's token,
# RabbitMQ's definitions). Each file <service>/<file> becomes the Docker secret ${MEGHA_SECRETS:-megha}-<service>-<file>
# (without .json). The agents of LM <lm> are the replicas of the service worker-<lm>, named worker-<lm>-<slot>: their
# secrets are Go templates (docker secret create --template-driver golang) that give each task slot, 1 to
# $MEGHA_AGENTS_PER_LM (default 2, as in stack.yml), the files of its own agent, and a slot beyond them nothing. The
# cluster secret the credentials are issued from becomes no Docker secret. Two files are kept in $MEGHA_KEEP_DIR
# (default ~/.megha), mode 0600: <MEGHA_SECRETS>-operator-token, the operator's API token (for the `megha` CLI:
# --token or MEGHA_API_TOKEN), and <MEGHA_SECRETS>-rabbitmq-admin-password, the password of the broker's
# administrator <run>-admin (management UI).
#
# Secrets that all exist are kept. Some existing without the others is an error: they come from one run of the
# generator (a password is in a user's URL and in RabbitMQ's definitions, a credential is certified by the
# deployment's root), and Docker gives no secret back to read; remove them (docker secret rm) to make new ones, with
# the stack removed first. So are more agents per LM than the secrets were made for.
set -eu

die() {
  echo "with-secrets.sh: $*" >&2
  exit 2
}

prefix=${MEGHA_SECRETS:-megha}
image=${MEGHA_IMAGE:-megha:latest}
run_id=${MEGHA_RUN_ID:-swarm}
agents=${MEGHA_AGENTS_PER_LM:-2}
keep=${MEGHA_KEEP_DIR:-$HOME/.megha}
# The services of stack.yml, and the files of each folder (python -m megha.deploy.secrets --help).
services="gm-0 gm-1 lm-0 lm-1 worker-0 worker-1 loadgen rabbitmq"
files_of() {
  case $1 in
  gm-* | lm-*) echo credential api-tokens amqp-url ;;
  worker-*) echo credential amqp-url ;;
  loadgen) echo operator-token amqp-url ;;
  rabbitmq) echo definitions.json ;;
  esac
}

command -v docker >/dev/null || die "docker is not installed"
case $agents in
'' | *[!0-9]* | 0*) die "MEGHA_AGENTS_PER_LM=$agents is not a count of agents" ;;
esac
present="" missing=""
for service in $services; do
  for file in $(files_of "$service"); do
    name=$prefix-$service-${file%.json}
    if docker secret inspect "$name" >/dev/null 2>&1; then
      present="$present $name"
    else
      missing="$missing $name"
    fi
  done
done

# The Go template giving task slot k of service $1 (worker-<lm>) the file $2 of agent worker-<lm>-k.
slots() {
  k=1
  while [ "$k" -le "$agents" ]; do
    printf '{{if eq .Task.Slot "%s"}}' "$k"
    cat "$folder/$1-$k/$2"
    printf '{{end}}'
    k=$((k + 1))
  done
}

if [ -n "$missing" ] && [ -n "$present" ]; then
  die "secrets$present exist but not$missing: make them all at once (docker secret rm$present, then run this again)"
elif [ -n "$missing" ]; then
  folder=$(mktemp -d)
  trap 'rm -rf "$folder"' EXIT
  names="gm-0,gm-1,lm-0,lm-1,loadgen,rabbitmq"
  k=1
  while [ "$k" -le "$agents" ]; do
    names="$names,worker-0-$k,worker-1-$k"
    k=$((k + 1))
  done
  docker run --rm --user "$(id -u):$(id -g)" -v "$folder:/secrets" "$image" \
    python -m megha.deploy.secrets /secrets --run-id "$run_id" --broker amqp://rabbitmq:5672/ --services "$names" ||
    die "the generator failed (is $image built? deploy/images/build.sh)"
  for service in $services; do
    for file in $(files_of "$service"); do
      name=$prefix-$service-${file%.json}
      source=$folder/$service/$file template=""
      case $service in
      worker-*)
        source=$folder/$service-$file.tmpl template="--template-driver golang"
        (umask 077 && slots "$service" "$file" >"$source")
        ;;
      esac
      # shellcheck disable=SC2086 # $template: no option, or the option and its value
      docker secret create $template "$name" "$source" >/dev/null ||
        die "docker secret create $name failed (is this node a swarm manager?)"
    done
  done
  (umask 077 && mkdir -p "$keep" && cp "$folder/operator-token" "$keep/$prefix-operator-token" &&
    cp "$folder/amqp-password-admin" "$keep/$prefix-rabbitmq-admin-password")
  echo "with-secrets.sh: made the secrets $prefix-* for run $run_id ($agents agents per LM); the operator's API" \
    "token is in $keep/$prefix-operator-token, the broker administrator's password in" \
    "$keep/$prefix-rabbitmq-admin-password" >&2
  rm -rf "$folder"
  trap - EXIT
else
  echo "with-secrets.sh: the secrets $prefix-* exist; kept" >&2
fi
[ $# -eq 0 ] || exec "$@"
