# One image for every Megha role; the command picks the role (see docker-compose.yml and docs/deploy.md):
#   python -m megha.services.gm | megha.services.lm | megha.services.worker | megha.loadgen.services
# Every setting comes from MEGHA_* environment variables (megha/common/settings.py).
#
# BASE_IMAGE is any Debian-like image with python3 (>= 3.11, with its venv module): the official python:3.11-slim
# by default, or the local megha-base:bookworm that deploy/images/build.sh makes from Debian's packages where no
# registry can be reached. Its python is /usr/local/bin/python3 in the first and /usr/bin/python3 in the second;
# the virtual environment links to whichever it is, so both stages use the same base.
ARG BASE_IMAGE=python:3.11-slim

# ------------------------------------------------------------------------------------------------ requirements
# The dependency list alone: the builder compares the copied file's content, so the dependencies' layer below is
# reused until the list itself changes, whatever else changes in pyproject.toml.
FROM ${BASE_IMAGE} AS requirements
COPY pyproject.toml /src/
RUN python3 -c 'import tomllib; print("\n".join(tomllib.load(open("/src/pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /requirements.txt

# ------------------------------------------------------------------------------------------------ dependencies
# A virtual environment at /opt/megha with the dependencies; reused until their list changes.
FROM ${BASE_IMAGE} AS deps

# pip trusts the base image's certificate authorities (ca-certificates), not only the ones it bundles: a base
# built by deploy/images/build.sh behind a TLS-inspecting proxy carries that proxy's CA.
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python3 -m venv /opt/megha
COPY --from=requirements /requirements.txt /tmp/requirements.txt
RUN /opt/megha/bin/pip install --no-cache-dir -r /tmp/requirements.txt

# The same environment without pip and setuptools, for the image.
FROM deps AS deps-runtime
RUN /opt/megha/bin/pip uninstall --yes --quiet pip setuptools

# ------------------------------------------------------------------------------------------------ Megha
# Megha itself, staged apart from its dependencies so that a change to the sources makes a small layer.
FROM deps AS build
WORKDIR /src
COPY . .
RUN /opt/megha/bin/pip install --no-cache-dir --no-deps --prefix=/stage/opt/megha . \
    && install -m 0755 deploy/images/healthcheck.py /stage/opt/megha/bin/megha-healthcheck

# ------------------------------------------------------------------------------------------------ runtime stage
FROM ${BASE_IMAGE}

# tini (PID 1) forwards SIGTERM/SIGINT to the service and reaps the task processes a worker agent starts. The
# Debian-built base already has it; python:3.11-slim gets it from Debian's packages.
RUN if ! command -v tini >/dev/null; then \
        apt-get update \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends tini \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && useradd --create-home --uid 1000 --user-group megha \
    && install -d -o megha -g megha -m 0750 /secrets

COPY --from=deps-runtime /opt/megha /opt/megha

ENV PATH=/opt/megha/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# /secrets (above): where the compose demo mounts its secrets volume, which takes the folder's owner and mode.
# Run from the home directory: the image holds no source tree, only the virtual environment in /opt/megha.
USER megha
WORKDIR /home/megha

# GM, LM, worker agent (MEGHA_PORT defaults).
EXPOSE 8000 8100 8200
# GET /healthz of the role's port; healthy while it runs for roles that serve no HTTP (the load generator).
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=3 CMD ["megha-healthcheck"]
ENTRYPOINT ["tini", "--"]
CMD ["megha", "--help"]

# The project last: a change to its sources rebuilds this one layer, and every instruction above stays cached (the
# legacy builder commits a container for each metadata instruction after a changed layer, about 4 s apiece). COPY
# makes root own the files whatever USER says, as before.
COPY --from=build /stage/ /
