#!/usr/bin/env bash
# Build Megha's images without a container registry: everything comes from Debian's packages and PyPI.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: deploy/images/build.sh [--rebuild] [--ca-file FILE|none] [--help]

Builds, on a machine that cannot pull images from a registry (Debian's package mirror and PyPI are enough):

  1. megha-base:bookworm      a minimal Debian bookworm (mmdebstrap --variant=minbase) with python3, python3-venv,
                              tini and ca-certificates, without docs or apt lists, loaded with `docker import`;
                              it also trusts the certificate authorities this machine trusts beyond Debian's
                              (see --ca-file), so pip reaches PyPI through a TLS-inspecting proxy as the host does;
  2. megha-rabbitmq:bookworm  RabbitMQ from Debian's rabbitmq-server package on that base, run in the foreground,
                              open to other containers (users from a definitions file, or the one user
                              RABBITMQ_DEFAULT_USER/PASS name), management UI on 15672, healthy once AMQP
                              clients can connect;
  3. megha-prometheus:bookworm  Prometheus from Debian's prometheus package on that base, run like the official
                              prom/prometheus image (its arguments are Prometheus's flags, data in /prometheus);
  4. megha:latest             the repository's Dockerfile with --build-arg BASE_IMAGE=megha-base:bookworm.

Steps 1 to 3 are skipped when their image is present and was made by the same recipe (a digest of the options,
files and base, kept in a label), so they run once per machine; step 4 always runs and reuses Docker's layer
cache, so the image follows the working tree. Then run the compose demo on them:

  mkdir -p out && chmod a+w out
  MEGHA_BASE_IMAGE=megha-base:bookworm MEGHA_RABBITMQ_IMAGE=megha-rabbitmq:bookworm \
  MEGHA_PROMETHEUS_IMAGE=megha-prometheus:bookworm \
      docker-compose up --exit-code-from loadgen            # or: docker compose up ...

Options:
  --rebuild        build every image again, even when present (the base, RabbitMQ and Prometheus images are
                   made afresh)
  --ca-file FILE   PEM bundle whose certificates missing from Debian's bundle the base image trusts too
                   (default: $SSL_CERT_FILE, else /etc/ssl/certs/ca-certificates.crt; `none`: Debian's only)
  --help           print this help

Environment:
  MEGHA_BASE_IMAGE       tag of the base image          (default megha-base:bookworm)
  MEGHA_RABBITMQ_IMAGE   tag of the RabbitMQ image      (default megha-rabbitmq:bookworm)
  MEGHA_PROMETHEUS_IMAGE tag of the Prometheus image    (default megha-prometheus:bookworm)
  MEGHA_IMAGE            tag of Megha's image           (default megha:latest)
  DEBIAN_MIRROR          Debian mirror for the base     (default http://deb.debian.org/debian)
  DEBIAN_SECURITY        Debian security mirror         (default http://deb.debian.org/debian-security)

Needs Docker and, for step 1 only, root (or sudo) and mmdebstrap, which is installed with apt-get when missing.
On a 2-core VM the steps took 23 s, 30 s, 30 s and 104 s the first time (step 4 downloads wheels from PyPI);
step 4 takes about 30 s when only the sources changed and a second when nothing did. The images hold 124, 180,
234 and 341 MB. `docker image prune` drops the cached dependency layers, and step 4 then downloads them again.
EOF
}

REBUILD=0
CA_FILE=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
while [ $# -gt 0 ]; do
  case "$1" in
    --rebuild) REBUILD=1 ;;
    --ca-file) [ $# -ge 2 ] || { echo "build.sh: --ca-file needs a file or none" >&2; exit 2; }; CA_FILE=$2; shift ;;
    --ca-file=*) CA_FILE=${1#--ca-file=} ;;
    -h | --help) usage; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BASE_IMAGE=${MEGHA_BASE_IMAGE:-megha-base:bookworm}
RABBITMQ_IMAGE=${MEGHA_RABBITMQ_IMAGE:-megha-rabbitmq:bookworm}
PROMETHEUS_IMAGE=${MEGHA_PROMETHEUS_IMAGE:-megha-prometheus:bookworm}
MEGHA_IMAGE=${MEGHA_IMAGE:-megha:latest}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${DEBIAN_SECURITY:-http://deb.debian.org/debian-security}

say() { echo "build.sh: $*" >&2; }
# An image made here carries a digest of what made it (options, files, base image): it is reused only while
# that digest is the same, so a change to the recipe rebuilds it.
LABEL=org.megha.recipe
digest() { sha256sum | cut -c1-16; }
current() {
  [ "$REBUILD" = 0 ] \
    && [ "$(docker image inspect --format "{{index .Config.Labels \"$LABEL\"}}" "$1" 2>/dev/null)" = "$2" ]
}
# Without a terminal (under a test runner) sudo must not wait for a password it cannot be given.
as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif [ -t 0 ]; then sudo "$@"; else sudo -n "$@"; fi
}
# The build's output is shown when it fails (the legacy builder, used where the buildx plugin is missing, also
# prints a deprecation warning that says nothing about the build).
docker_build() {
  local log
  log=$(mktemp)
  if ! docker build --force-rm "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}

command -v docker >/dev/null || { say "docker is not installed"; exit 1; }
docker info >/dev/null 2>&1 || { say "the Docker engine does not answer (is dockerd running, may you use it?)"; exit 1; }

# ---------------------------------------------------------------------------------------------- 1. base image
# A customize hook of mmdebstrap (run on the host, $1 = the new root): every certificate of the CA file that
# Debian's bundle lacks goes to /usr/local/share/ca-certificates, where update-ca-certificates keeps it for good.
ADD_CAS=$(
  cat <<'HOOK'
#!/bin/sh
set -eu
[ -r "$CA_FILE" ] || exit 0
awk -v dir="$1/usr/local/share/ca-certificates" '
  /-----BEGIN CERTIFICATE-----/ { pem = "" }
  { pem = pem $0 "\n" }
  /-----END CERTIFICATE-----/ {
    if (FILENAME == ARGV[1]) known[pem] = 1
    else if (!(pem in known)) { n++; f = sprintf("%s/host-%03d.crt", dir, n); printf "%s", pem > f; close(f) }
  }
' "$1/etc/ssl/certs/ca-certificates.crt" "$CA_FILE"
chroot "$1" update-ca-certificates >/dev/null 2>&1
HOOK
)
# minbase + merged /usr without the usrmerge package (which would pull in perl); no recommends, no docs, man
# pages or translations (the dpkg filters stay in the image, so packages installed later skip them too).
# mmdebstrap cleans the apt lists and cache itself.
# shellcheck disable=SC2016,SC2054 # "$1" in the hook is mmdebstrap's (the new root); commas list packages.
BASE_OPTIONS=(
  --variant=minbase --include=python3,python3-venv,tini,ca-certificates
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --aptopt='APT::Install-Recommends "false"'
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias'
  --customize-hook='rm -rf "$1"/var/log/apt/* "$1"/var/log/dpkg.log "$1"/var/cache/debconf/*-old'
  bookworm -
  "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" "deb $SECURITY bookworm-security main"
)
[ "$CA_FILE" = none ] || [ -r "$CA_FILE" ] || { say "--ca-file $CA_FILE is not readable"; exit 2; }
base_recipe=$({ printf '%s\n' "${BASE_OPTIONS[@]}" "$ADD_CAS"; [ "$CA_FILE" = none ] || cat "$CA_FILE"; } | digest)

SECONDS=0
if current "$BASE_IMAGE" "$base_recipe"; then
  say "$BASE_IMAGE is present (--rebuild makes it again)"
else
  if ! command -v mmdebstrap >/dev/null; then
    say "installing mmdebstrap from Debian's packages"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null \
      || { as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null; }
  fi
  say "building $BASE_IMAGE from Debian bookworm ($MIRROR)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  printf '%s' "$ADD_CAS" >"$work/add-cas"
  chmod 0755 "$work/add-cas"
  # The mirrors are given, so mmdebstrap does not read stdin. Its log is shown when it fails.
  if ! as_root env CA_FILE="$CA_FILE" mmdebstrap --quiet --customize-hook="$work/add-cas" "${BASE_OPTIONS[@]}" \
    </dev/null 2>"$work/mmdebstrap.log" \
    | docker import \
      --change 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["python3"]' \
      --change "LABEL $LABEL=$base_recipe" \
      --message "Debian bookworm minbase with python3, python3-venv, tini (deploy/images/build.sh)" \
      - "$BASE_IMAGE" >/dev/null; then
    cat "$work/mmdebstrap.log" >&2
    say "building $BASE_IMAGE failed"
    exit 1
  fi
  say "built $BASE_IMAGE in ${SECONDS} s"
fi

# ------------------------------------------------------------------------------- 2. RabbitMQ, 3. Prometheus
# Each is the Dockerfile of deploy/images/<dir> on the base image, installing one of Debian's packages.
on_base() { # image, its directory here, the Debian package
  local recipe
  recipe=$({ docker image inspect --format '{{.Id}}' "$BASE_IMAGE"; cat "$HERE/$2"/*; } | digest)
  SECONDS=0
  if current "$1" "$recipe"; then
    say "$1 is present (--rebuild makes it again)"
  else
    say "building $1 from Debian's $3 on $BASE_IMAGE"
    docker_build --build-arg BASE_IMAGE="$BASE_IMAGE" --label "$LABEL=$recipe" -t "$1" "$HERE/$2"
    say "built $1 in ${SECONDS} s"
  fi
}
on_base "$RABBITMQ_IMAGE" rabbitmq rabbitmq-server
on_base "$PROMETHEUS_IMAGE" prometheus prometheus

# ---------------------------------------------------------------------------------------------- 4. Megha
SECONDS=0
say "building $MEGHA_IMAGE on $BASE_IMAGE (layers cached from earlier builds are reused)"
extra=()
[ "$REBUILD" = 1 ] && extra=(--no-cache)
docker_build "${extra[@]}" --build-arg BASE_IMAGE="$BASE_IMAGE" -t "$MEGHA_IMAGE" "$ROOT"
say "built $MEGHA_IMAGE in ${SECONDS} s"

for image in "$BASE_IMAGE" "$RABBITMQ_IMAGE" "$PROMETHEUS_IMAGE" "$MEGHA_IMAGE"; do
  printf '%-28s %4d MB\n' "$image" $(($(docker image inspect --format '{{.Size}}' "$image") / 1000000))
done
