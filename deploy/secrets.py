"""The secrets of a deployment, made once into a folder, and each service's share of them in a folder of its own:
`python -m megha.deploy.secrets DIR --services gm-0,lm-0,worker-0-0,loadgen,rabbitmq`.

DIR holds the root material, which only the maker of the secrets reads: the cluster secret (the root the services'
credentials are issued from), the operator's API token, a password per broker user, each role's full broker URL
and RabbitMQ's definitions of those users. DIR/<service>/ holds exactly what that one service reads
(`SERVICE_FILES`): a GM or an LM its own credential, the users' API tokens as digests and its role's broker URL; a
worker agent its own credential and its role's broker URL; the load generator the operator's token and its broker
URL; RabbitMQ its users' definitions. The compose demo mounts each service's folder into that service alone, and
deploy/swarm/with-secrets.sh turns the folders' files into Docker secrets; `megha local` keeps its secrets in memory
instead (deploy/local.py).

Each random secret is made only when its file is missing, so running it again keeps a deployment's credentials;
everything else is derived from them (a credential too: its key is derived from the cluster secret, not drawn) and
written again each time, from the kept secrets and the options. Files are written whole (a reader never sees half
a file), mode 0600 in folders of mode 0700; RabbitMQ's 0640 in 0750, for a broker that reads them through the
group. Run as root, it gives each service's folder and files to the user that service runs as (`--owner`). What
each file is for is in docs/security.md.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast
from urllib.parse import urlsplit, urlunsplit

from megha.common.auth import Credential, Role, new_secret, token_digest
from megha.common.transport.rabbit import BROKER_ROLES, broker_permissions, broker_user
from megha.common.usage import OneLineParser

CLUSTER_SECRET = "cluster-secret"
"""The root the services' credentials are issued from: in DIR only, never in a service's folder."""
OPERATOR_TOKEN = "operator-token"
"""The operator's API token: in DIR (for the `megha` CLI, MEGHA_API_TOKEN) and the load generator's folder
(MEGHA_API_TOKEN_FILE)."""
DEFINITIONS = "rabbitmq-definitions.json"
"""RabbitMQ's users and permissions: loaded by the broker at its start, or by `rabbitmqctl import_definitions`."""
OPERATOR = "operator"
ADMIN = "admin"
"""The broker's administrator (management UI, dead letters): `<run>-admin`, password in amqp-password-admin."""

CREDENTIAL = "credential"
"""A GM's, LM's or agent's own credential (MEGHA_CREDENTIAL_FILE), issued for its role and id."""
API_TOKENS = "api-tokens"
"""MEGHA_API_TOKENS_FILE of the GMs and LMs: `operator=sha256:<hex>`, the operator's token as its digest."""
AMQP_URL = "amqp-url"
"""MEGHA_AMQP_URL_FILE: the broker URL of the service's role's user."""
BROKER_DEFINITIONS = "definitions.json"
"""RabbitMQ's folder: its users' definitions."""

Kind = Literal["gm", "lm", "worker", "loadgen", "rabbitmq"]
SERVICE_FILES: dict[Kind, tuple[str, ...]] = {
    "gm": (CREDENTIAL, API_TOKENS, AMQP_URL),
    "lm": (CREDENTIAL, API_TOKENS, AMQP_URL),  # the users' digests: operators read an LM's state (`megha nodes`)
    "worker": (CREDENTIAL, AMQP_URL),  # no user's token: users reach an agent only through the GM and its LM
    "loadgen": (OPERATOR_TOKEN, AMQP_URL),
    "rabbitmq": (BROKER_DEFINITIONS,),
}
"""What each kind of service finds in its folder."""
OWNERS: dict[Kind, tuple[int, int]] = {
    "gm": (1000, 1000),
    "lm": (1000, 1000),
    "worker": (0, 0),  # agents run as root, to run each exec task under a uid of its own
    "loadgen": (1000, 1000),
    "rabbitmq": (1000, 1000),  # the broker reads through the group (the compose demo's group_add)
}
"""The uid and gid each kind of service runs as in the image (the megha user is 1000): its folder's owner when the
maker runs as root."""
GROUP_READ: frozenset[Kind] = frozenset({"rabbitmq"})
"""Kinds whose folder the group may read: RabbitMQ's user differs between images."""


def password_file(role: str) -> str:
    return f"amqp-password-{role}"


def url_file(role: str) -> str:
    """The role's broker URL in DIR, copied into the folder of each of the role's services."""
    return f"amqp-url-{role}"


@dataclass(frozen=True, slots=True)
class Service:
    """A service `--services` names: its folder (the compose service's name), its kind, and the id its credential
    is issued for (GMs and LMs: MEGHA_GM_ID, MEGHA_LM_ID; agents: the whole name, MEGHA_WORKER_ID)."""

    name: str
    kind: Kind
    ident: str = ""

    @classmethod
    def parse(cls, name: str) -> Service:
        """ValueError says what names are."""
        if name in ("loadgen", "rabbitmq"):
            return cls(name, cast(Kind, name))
        if match := re.fullmatch(r"(gm|lm)-(0|[1-9][0-9]{0,5})", name):
            return cls(name, cast(Kind, match[1]), match[2])
        if re.fullmatch(r"worker-[A-Za-z0-9_.-]{1,57}", name):
            return cls(name, "worker", name)
        raise ValueError(f"{name!r} is not gm-<id>, lm-<id>, worker-<name>, loadgen or rabbitmq")


def parse_services(text: str) -> list[Service]:
    """`--services`: names separated by commas; ValueError names a bad or repeated one."""
    services = [Service.parse(name.strip()) for name in text.split(",") if name.strip()]
    names = [s.name for s in services]
    if repeated := sorted({name for name in names if names.count(name) > 1}):
        raise ValueError(f"{', '.join(repeated)} given twice")
    return services


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


def _write(path: Path, text: str, mode: int = 0o600, owner: tuple[int, int] | None = None) -> None:
    """`text` into `path` atomically, with `mode` (and `owner`: uid, gid)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        if owner is not None:
            os.fchown(fd, *owner)
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


def _service_files(
    service: Service, cluster_secret: str, token: str, urls: dict[str, str], users: str
) -> dict[str, str]:
    """What `service`'s folder holds: file name -> text."""
    texts = {API_TOKENS: f"{OPERATOR}={token_digest(token)}\n", OPERATOR_TOKEN: token + "\n", BROKER_DEFINITIONS: users}
    if service.kind in BROKER_ROLES:
        texts[AMQP_URL] = urls[service.kind] + "\n"
    if service.ident:
        texts[CREDENTIAL] = Credential.issue(cluster_secret, cast(Role, service.kind), service.ident).encode() + "\n"
    return {name: texts[name] for name in SERVICE_FILES[service.kind]}


def make_secrets(
    folder: Path,
    run_id: str,
    broker: str,
    services: list[Service] | tuple[Service, ...] = (),
    owners: dict[Kind, tuple[int, int]] | None = None,
) -> dict[str, Path]:
    """Every secret of a deployment in `folder` (made if missing, kept otherwise), and each of `services`' share in
    `folder/<service>/`, given to `owners[kind]` if set: name (`<service>/<file>` for a service's) -> file."""
    folder.mkdir(parents=True, exist_ok=True)
    cluster_secret = _kept(folder / CLUSTER_SECRET)
    token = _kept(folder / OPERATOR_TOKEN)
    passwords = {role: _kept(folder / password_file(role)) for role in (*BROKER_ROLES, ADMIN)}
    urls = {role: role_url(broker, broker_user(run_id, role), passwords[role]) for role in BROKER_ROLES}
    for role in BROKER_ROLES:
        _write(folder / url_file(role), urls[role] + "\n")
    users = json.dumps(definitions(run_id, passwords), indent=2) + "\n"
    _write(folder / DEFINITIONS, users, 0o640)
    made = {path.name: path for path in sorted(folder.iterdir()) if path.is_file() and not path.name.startswith(".")}
    for service in services:
        own = folder / service.name
        group = service.kind in GROUP_READ
        owner = None if owners is None else owners[service.kind]
        own.mkdir(exist_ok=True)
        if owner is not None:
            os.chown(own, *owner)
        own.chmod(0o750 if group else 0o700)
        for name, text in _service_files(service, cluster_secret, token, urls, users).items():
            _write(own / name, text, 0o640 if group else 0o600, owner)
            made[f"{service.name}/{name}"] = own / name
    return made


def _owner(text: str) -> tuple[Kind, tuple[int, int]]:
    kind, sep, ids = text.partition("=")
    uid, _, gid = ids.partition(":")
    if not sep or kind not in OWNERS or not uid.isdigit() or not (gid or uid).isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not KIND=UID[:GID] with KIND one of {', '.join(OWNERS)}")
    return cast(Kind, kind), (int(uid), int(gid or uid))


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m megha.deploy.secrets",
        description="Make a deployment's secrets in DIR, keeping those it holds (the cluster secret, the operator's "
        "API token, a RabbitMQ user per role and RabbitMQ's definitions of them), and give each service of "
        "--services a folder DIR/<service> of exactly what it reads: a GM or LM its own credential, the users' API "
        "tokens as digests and its role's broker URL (credential, api-tokens, amqp-url); a worker agent its own "
        "credential and broker URL; the load generator the operator's token and its broker URL (operator-token, "
        "amqp-url); RabbitMQ its users (definitions.json). No folder holds the cluster secret. docs/security.md "
        "says what each file is.",
    )
    parser.add_argument("dir", type=Path, help="folder of the secret files (made if missing)")
    parser.add_argument(
        "--services",
        default="",
        metavar="NAME,...",
        help="the services to make a folder for, separated by commas, each named as in docker-compose.yml: "
        "gm-<MEGHA_GM_ID>, lm-<MEGHA_LM_ID>, worker-<...> (a worker agent, whose MEGHA_WORKER_ID is the whole "
        "name), loadgen, rabbitmq; e.g. gm-0,gm-1,lm-0,lm-1,worker-0-0,worker-1-0,loadgen,rabbitmq (default: "
        "none, DIR's own files only). Folders of services no longer named are left as they are",
    )
    parser.add_argument(
        "--owner",
        type=_owner,
        action="append",
        default=[],
        metavar="KIND=UID[:GID]",
        help="run as root: the owner of the folders of KIND (gm, lm, worker, loadgen, rabbitmq), the user its "
        "container runs as; may be repeated (default: worker 0:0, the agents run as root to give each exec task a "
        "uid of its own; every other kind 1000:1000, the image's megha user). Not root and no --owner: the files "
        "are the running user's",
    )
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
    parser.add_argument(
        "--ready",
        type=Path,
        metavar="FILE",
        help="made once every file is written (a health check's test; removed first if there)",
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
        services = parse_services(args.services)
    except ValueError as exc:
        print(f"{prog}: --services: {exc}", file=sys.stderr)
        return 2
    owners = {**OWNERS, **dict(args.owner)} if args.owner or os.geteuid() == 0 else None
    try:
        if args.ready is not None:
            args.ready.unlink(missing_ok=True)
        made = make_secrets(args.dir, args.run_id, args.broker, services, owners)
        if args.ready is not None:
            args.ready.touch()
    except OSError as exc:
        print(f"{prog}: cannot write the secrets in {args.dir}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    folders = f", a folder for each of {len(services)} services" if services else ""
    print(f"{prog}: {len(made)} secret files in {args.dir}{folders}, for run {args.run_id}", file=sys.stderr)
    if args.stay:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
        while True:
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
