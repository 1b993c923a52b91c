"""Who is calling: users with API tokens, services with signed tokens (no I/O; the services' edge is
`services/auth.py`, the settings that configure it `common/settings.py`).

Two kinds of credential travel as `Authorization: Bearer <token>`:

- A user's **API token**, an opaque random string the GM maps to its user (`MEGHA_API_TOKENS`). A user submits to
  its own queue (queues are named after their users) and sees and cancels its own jobs; a user named in
  `MEGHA_OPERATORS` acts for every user (the load generator replays traces of many users with such a token).
- A service's **signed token**, `megha1.<role>.<id>.<expires>.<hmac>`: an HMAC-SHA256, keyed with the
  deployment's cluster secret (`MEGHA_CLUSTER_SECRET`), of the service's role (gm, lm, worker), its id and an
  expiry a few minutes ahead. Services make a fresh one every minute (`Signer`); a receiver checks the signature
  and the expiry (`Verifier`) and then the role a route allows (`services/auth.py`). Whoever lacks the cluster
  secret cannot forge a launch, a preemption or a registration.

Everything that holds the cluster secret can sign any role: the secret is for the services of one deployment, and
the broker's per-role users (docs/security.md) limit what each role can do on RabbitMQ.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from typing import Literal

Role = Literal["user", "gm", "lm", "worker"]
SERVICE_ROLES: tuple[Role, ...] = ("gm", "lm", "worker")

SCHEME = "Bearer"
PREFIX = "megha1"
TOKEN_LIFETIME = 300.0
"""Seconds a signed token is valid: a replayed token is useless after this long."""
RENEW_AFTER = 60.0
"""Seconds a `Signer` hands out the same token before it makes a fresh one."""
CLOCK_SKEW = 30.0
"""Seconds a token may seem to come from the future (clocks of two hosts differ)."""

MIN_SECRET_CHARS = 16
USER_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
_SERVICE_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who made a request: a user (`name` is the user, `operator` if it acts for every user) or a service
    (`role` gm, lm or worker, `name` its id)."""

    role: Role
    name: str
    operator: bool = False

    @property
    def is_user(self) -> bool:
        return self.role == "user"

    def may_act_for(self, user: str) -> bool:
        """Whether this principal may submit for, see and cancel the jobs of `user`."""
        return self.operator or (self.is_user and self.name == user)

    def __str__(self) -> str:
        if self.is_user:
            return f"user {self.name}" + (" (operator)" if self.operator else "")
        return f"{self.role} {self.name}"


class Unauthenticated(Exception):
    """No credential, or one that is not valid: 401."""


def new_secret() -> str:
    """A fresh random secret or API token (URL-safe, 256 bits)."""
    return secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    """What `MEGHA_API_TOKENS` may hold instead of a token: `sha256:<hex>` of it."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def parse_api_tokens(text: str) -> dict[str, str]:
    """`user=token` entries, separated by commas or new lines (a token file), as {sha256 digest of token: user}.
    A token may be given as its digest (`user=sha256:<64 hex>`), so that the GM's settings need not hold it.
    Blank lines and lines starting with # are skipped; ValueError names what is wrong, never the token."""
    digests: dict[str, str] = {}
    for number, raw in enumerate(re.split(r"[,\n]", text), 1):
        entry = raw.strip()
        if not entry or entry.startswith("#"):
            continue
        user, sep, token = (part.strip() for part in entry.partition("="))
        if not sep or not user or not token:
            raise ValueError(f"entry {number} is not user=token")
        if not USER_NAME.match(user):
            raise ValueError(f"entry {number}: user {user!r} is not 1-64 letters, digits or _ . @ -")
        if re.fullmatch(r"sha256:[0-9a-f]{64}", token):
            digest = token
        elif len(token) < MIN_SECRET_CHARS:
            raise ValueError(f"entry {number} (user {user}): a token needs at least {MIN_SECRET_CHARS} characters")
        else:
            digest = token_digest(token)
        if digests.get(digest, user) != user:
            raise ValueError(f"entry {number}: users {digests[digest]} and {user} have the same token")
        digests[digest] = user
    return digests


def _mac(secret: bytes, claim: str) -> str:
    return hmac.new(secret, claim.encode(), hashlib.sha256).hexdigest()


class Signer:
    """Makes the signed tokens of one service (`role`, `ident`), a fresh one every `RENEW_AFTER` seconds."""

    def __init__(self, secret: str, role: Role, ident: str) -> None:
        if role not in SERVICE_ROLES:
            raise ValueError(f"not a service role: {role}")
        if not _SERVICE_ID.match(ident):
            raise ValueError(f"not a service id: {ident!r}")
        self._secret = secret.encode()
        self.role = role
        self.ident = ident
        self._header = ""
        self._renew_at = 0.0

    def token(self, now: float) -> str:
        expires = int(now + TOKEN_LIFETIME)
        claim = f"{PREFIX}.{self.role}.{self.ident}.{expires}"
        return f"{claim}.{_mac(self._secret, claim)}"

    def header(self) -> str:
        """The `Authorization` header value to send now."""
        now = time.time()
        if now >= self._renew_at:
            self._header = f"{SCHEME} {self.token(now)}"
            self._renew_at = now + RENEW_AFTER
        return self._header


class Verifier:
    """Checks bearer tokens: services' signed tokens against the cluster secret, users' API tokens against their
    digests. Tokens already verified are remembered until they expire, so a request costs a dict lookup."""

    def __init__(self, secret: str, api_tokens: dict[str, str] | None = None, operators: frozenset[str] = frozenset()):
        self._secret = secret.encode()
        self._users = dict(api_tokens or {})
        self._operators = operators
        self._known: dict[str, tuple[Principal, float]] = {}

    def principal(self, authorization: str | None, now: float) -> Principal:
        """The principal an `Authorization` header value names; `Unauthenticated` says why it names none."""
        if not authorization:
            raise Unauthenticated("no credential: send Authorization: Bearer <token>")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != SCHEME.lower() or not token:
            raise Unauthenticated("the Authorization header is not Bearer <token>")
        known = self._known.get(token)
        if known is not None and now < known[1]:
            return known[0]
        principal, until = self._service(token, now) if token.startswith(PREFIX + ".") else self._user(token, now)
        if len(self._known) >= 4096:
            self._known = {t: k for t, k in self._known.items() if now < k[1]}
        self._known[token] = (principal, until)
        return principal

    def _service(self, token: str, now: float) -> tuple[Principal, float]:
        claim, _, mac = token.rpartition(".")
        parts = claim.split(".")
        if len(parts) != 4 or parts[1] not in SERVICE_ROLES or not parts[3].isdigit():
            raise Unauthenticated("malformed service token")
        if not self._secret or not hmac.compare_digest(_mac(self._secret, claim), mac):
            raise Unauthenticated("service token not signed with this deployment's cluster secret")
        expires = int(parts[3])
        if expires <= now:
            raise Unauthenticated("service token expired")
        if expires > now + TOKEN_LIFETIME + CLOCK_SKEW:
            raise Unauthenticated("service token valid for longer than allowed (clock skew?)")
        role: Role = parts[1]  # type: ignore[assignment]
        return Principal(role, parts[2]), float(expires)

    def _user(self, token: str, now: float) -> tuple[Principal, float]:
        user = self._users.get(token_digest(token))
        if user is None:
            raise Unauthenticated("unknown API token")
        return Principal("user", user, operator=user in self._operators), now + RENEW_AFTER
