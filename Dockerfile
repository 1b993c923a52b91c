# One image for every Megha role; the command picks the role (see docker-compose.yml and docs/deploy.md):
#   python -m megha.services.gm | megha.services.lm | megha.services.worker | megha.loadgen.services
# Every setting comes from MEGHA_* environment variables (megha/common/settings.py).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY . .
RUN pip install --no-cache-dir . \
    && useradd --create-home --uid 1000 megha

# Run from the home directory, not /src: there the source folder `megha/` would shadow the installed package.
USER megha
WORKDIR /home/megha

# GM, LM, worker agent (MEGHA_PORT defaults).
EXPOSE 8000 8100 8200
CMD ["megha", "--help"]
