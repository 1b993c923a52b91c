"""The secrets of a deployment, made once into a folder: `python -m megha.deploy.secrets DIR`.

The compose demo runs it in a one-off service writing to a volume, and deploy/swarm/with-secrets.sh turns its files
into Docker secrets; `megha local` keeps its secrets in memory instead (deploy/local.py). Each random secret is made
only when its file is missing, so running it again keeps a deployment's credentials; the files derived from them
(URLs, the API tokens file, RabbitMQ's definitions) are written again each time, from the kept secrets and the
options. Files are written whole (a reader never sees half a file), mode 0600; RabbitMQ's definitions 0640, for a
broker that reads them through the files' group. What each file is for is in docs/security.md.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import secrets
import signal
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from megha.common.auth import new_secret
from megha.common.transport.rabbit import BROKER_ROLES, broker_permissions, broker_user

CLUSTER_SECRET = "cluster-secret"
"""MEGHA_CLUSTER_SECRET_FILE of every GM, LM and worker agent."""
OPERATOR_TOKEN = "operator-token"
"""The operator's API token: MEGHA_API_TOKEN_FILE of the load generator,
and what an operator gives the `megha` CLI (MEGHA_API_TOKEN)."""
API_TOKENS = "api-tokens"
"""MEGHA_API_TOKENS_FILE of the GMs: `operator=<the operator's token>`."""
DEFINITIONS = "rabbitmq-definitions.json"
"""RabbitMQ's users and permissions: loaded by the broker at its start, or by `rabbitmqctl import_definitions`."""
OPERATOR = "operator"
ADMIN = "admin"
"""The broker's administrator (management UI, dead letters): `<run>-admin`, password in amqp-password-admin."""


def password_file(role: str) -> str:
    return f"amqp-password-{role}"


def url_file(role: str) -> str:
    """MEGHA_AMQP_URL_FILE of the role's services."""
    return f"amqp-url-{role}"


def password_hash(password: str, salt: bytes | None = None) -> str:
    """RabbitMQ's rabbit_password_hashing_sha256: base64 of a 4-byte salt and SHA-256 of salt + password."""
    salt = secrets.token_bytes(4) if salt is None else salt
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def role_url(broker: str, user: str, password: str) -> str:
    """`broker` (amqp[s]://host[:port][/vhost], no user) with `user` and `password` in it."""
    parts = urlsplit(broker)
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{netloc}", path=parts.path or "/"))


def definitions(run_id: str, passwords: dict[str, str]) -> dict[str, object]:
    """RabbitMQ definitions: vhost /, a user per role with its permissions (broker_permissions), an administrator."""
    permissions = broker_permissions(run_id)
    users = [(broker_user(run_id, role), passwords[role]) for role in BROKER_ROLES]
    admin = broker_user(run_id, ADMIN)
    return {
        "vhosts": [{"name": "/"}],
        "users": [
            {
                "name": name,
                "password_hash": password_hash(password),
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": ["administrator"] if name == admin else [],
            }
            for name, password in [*users, (admin, passwords[ADMIN])]
        ],
        "permissions": [
            {"user": broker_user(run_id, role), "vhost": "/", "configure": c, "write": w, "read": r}
            for role, (c, w, r) in permissions.items()
        ]
        + [{"user": admin, "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}],
    }


def _write(path: Path, text: str, mode: int = 0o600) -> None:
    """`text` into `path` atomically, with `mode`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _kept(path: Path) -> str:
    """The secret in `path`, made (and written) if the file is missing."""
    if path.exists():
        value = path.read_text().strip()
        if value:
            return value
    value = new_secret()
    _write(path, value + "\n")
    return value


def make_secrets(folder: Path, run_id: str, broker: str) -> dict[str, Path]:
    """Every secret of a deployment in `folder` (made if missing, kept otherwise): name -> file."""
    folder.mkdir(parents=True, exist_ok=True)
    _kept(folder / CLUSTER_SECRET)
    token = _kept(folder / OPERATOR_TOKEN)
    _write(folder / API_TOKENS, f"{OPERATOR}={token}\n")
    passwords = {role: _kept(folder / password_file(role)) for role in (*BROKER_ROLES, ADMIN)}
    for role in BROKER_ROLES:
        _write(folder / url_file(role), role_url(broker, broker_user(run_id, role), passwords[role]) + "\n")
    _write(folder / DEFINITIONS, json.dumps(definitions(run_id, passwords), indent=2) + "\n", 0o640)
    return {path.name: path for path in sorted(folder.iterdir()) if not path.name.startswith(".")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m megha.deploy.secrets",
        description="Make a deployment's secrets in DIR, keeping those it holds: the cluster secret, the operator's "
        "API token and the GMs' token file, a RabbitMQ user per role (password, full URL) and RabbitMQ's "
        "definitions of them (docs/security.md).",
    )
    parser.add_argument("dir", type=Path, help="folder of the secret files (made if missing)")
    parser.add_argument(
        "--run-id",
        default=os.environ.get("MEGHA_RUN_ID", "megha"),
        help="the deployment's run id: the broker users may use its exchanges and queues only (default "
        "$MEGHA_RUN_ID, else megha)",
    )
    parser.add_argument(
        "--broker",
        default="amqp://rabbitmq:5672/",
        help="RabbitMQ as the services reach it, without a user: amqp[s]://host[:port][/vhost] "
        "(default amqp://rabbitmq:5672/)",
    )
    parser.add_argument(
        "--stay",
        action="store_true",
        help="then wait until stopped (a compose service the others wait for, healthy once the files are written)",
    )
    args = parser.parse_args(argv)
    prog = parser.prog
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", args.run_id):
        print(f"{prog}: --run-id {args.run_id!r} is not 1-64 letters, digits and _ . -", file=sys.stderr)
        return 2
    parts = urlsplit(args.broker)
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname or "@" in parts.netloc:
        print(f"{prog}: --broker {args.broker} is not amqp[s]://host[:port][/vhost] without a user", file=sys.stderr)
        return 2
    try:
        made = make_secrets(args.dir, args.run_id, args.broker)
    except OSError as exc:
        print(f"{prog}: cannot write the secrets in {args.dir}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"{prog}: {len(made)} secret files in {args.dir} for run {args.run_id}", file=sys.stderr)
    if args.stay:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
        while True:
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
