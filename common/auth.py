"""Who is calling: users with API tokens, services with signed tokens (no I/O; the services' edge is
`services/auth.py`, the settings that configure it `common/settings.py`).

Two kinds of credential travel as `Authorization: Bearer <token>`:

- A user's **API token**, an opaque random string the GM maps to its user (`MEGHA_API_TOKENS`). A user submits to
  its own queue (queues are named after their users) and sees and cancels its own jobs; a user named in
  `MEGHA_OPERATORS` acts for every user (the load generator replays traces of many users with such a token).
- A service's **signed token**, `megha2.<claim>.<signature>`: the claim (role gm, lm or worker; the service's id;
  its public key; the deployment's certificate of that key; an expiry a few minutes ahead) signed with the
  service's own Ed25519 key. Services make a fresh one every minute (`Signer`); a receiver checks the certificate
  against the deployment's root public key, the signature against the certified key, and the expiry (`Verifier`),
  and then the role a route allows and the identity it names (`services/auth.py`).

Each service holds only its own **credential** (`MEGHA_CREDENTIAL`): its private key, the root's certificate of
its (role, id, public key), and the root's public key. The root private key is derived from the deployment's
cluster secret (`MEGHA_CLUSTER_SECRET`), which only the tool that issues credentials needs (`megha local`, the
compose demo's and the swarm stack's secret makers, `megha credential`). So nothing an agent holds can sign as a
GM, an LM or another agent, and a compromised service can sign only as itself. The same credential signs an LM's
broker messages to its GMs (`MessageSigner`, checked by `MessageVerifier`: docs/security.md, "Broker reports"),
which has the threat model.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

Role = Literal["user", "gm", "lm", "worker"]
SERVICE_ROLES: tuple[Role, ...] = ("gm", "lm", "worker")

SCHEME = "Bearer"
PREFIX = "megha2"
"""First part of a service's signed token."""
MAX_TOKEN_CHARS = 4096
"""A bearer token longer than this is refused unread (a service's is under 400 characters, a user's what the
operator chose)."""
CREDENTIAL_PREFIX = "megha-credential1"
"""First part of a service's credential (MEGHA_CREDENTIAL)."""
TOKEN_LIFETIME = 300.0
"""Seconds a signed token is valid: a replayed token is useless after this long."""
RENEW_AFTER = 60.0
"""Seconds a `Signer` hands out the same token before it makes a fresh one."""
CLOCK_SKEW = 30.0
"""Seconds a token may seem to come from the future (clocks of two hosts differ)."""

MIN_SECRET_CHARS = 16
USER_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
SERVICE_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


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


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _private_key(raw: bytes) -> Ed25519PrivateKey:
    """An Ed25519 private key. cryptography is imported on first use, here and in `_public_key`: every command
    reads the settings models, which refer to this module, but only the services and the tools that issue
    credentials sign or verify (`megha replay` never does)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(raw)


def _public_key(raw: bytes) -> Ed25519PublicKey:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    return Ed25519PublicKey.from_public_bytes(raw)


def _verifies(key: Ed25519PublicKey, signature: bytes, data: bytes) -> bool:
    """True when `signature` is `key`'s signature of `data`."""
    from cryptography.exceptions import InvalidSignature

    try:
        key.verify(signature, data)
    except InvalidSignature:
        return False
    return True


def _raw(key: Ed25519PublicKey) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _certified(role: str, ident: str, public: bytes) -> bytes:
    """What the root signs to certify that `public` is the key of service (`role`, `ident`)."""
    return b"megha-certificate1\0" + role.encode() + b"\0" + ident.encode() + b"\0" + public


def _derived(secret: str, purpose: str) -> bytes:
    return hmac.new(secret.encode(), purpose.encode(), hashlib.sha256).digest()


def root_key(cluster_secret: str) -> Ed25519PrivateKey:
    """The deployment's root key, derived from its cluster secret: it certifies every service's key."""
    return _private_key(_derived(cluster_secret, "megha root key"))


def root_public(cluster_secret: str) -> bytes:
    """The root's public key (raw, 32 bytes): what every verifier trusts."""
    return _raw(root_key(cluster_secret).public_key())


@dataclass(frozen=True, slots=True)
class Credential:
    """One service's identity: its private key, the root's certificate of (role, id, public key), and the root's
    public key, against which it checks the tokens of the services that call it."""

    role: Role
    ident: str
    key: bytes  # the service's Ed25519 private key (raw, 32 bytes)
    certificate: bytes  # the root's signature of _certified(role, ident, public key)
    root: bytes  # the root's public key (raw)

    @classmethod
    def issue(cls, cluster_secret: str, role: Role, ident: str) -> Credential:
        """The credential of service (`role`, `ident`), made from the deployment's cluster secret (the same one
        each time: keys are derived, not drawn)."""
        if role not in SERVICE_ROLES:
            raise ValueError(f"not a service role: {role}")
        if not SERVICE_ID.match(ident):
            raise ValueError(f"not a service id: {ident!r}")
        key = _private_key(_derived(cluster_secret, f"megha service key\0{role}\0{ident}"))
        root = root_key(cluster_secret)
        certificate = root.sign(_certified(role, ident, _raw(key.public_key())))
        return cls(role, ident, key.private_bytes_raw(), certificate, _raw(root.public_key()))

    def encode(self) -> str:
        """One line, `megha-credential1.<base64 of JSON>` (what MEGHA_CREDENTIAL holds)."""
        body = {"role": self.role, "id": self.ident, "key": _b64(self.key), "cert": _b64(self.certificate)}
        body["root"] = _b64(self.root)
        return f"{CREDENTIAL_PREFIX}.{_b64(json.dumps(body, separators=(',', ':')).encode())}"

    @classmethod
    def decode(cls, text: str) -> Credential:
        """The credential `encode` wrote; ValueError says what is wrong (never the key)."""
        prefix, _, body = text.strip().partition(".")
        if prefix != CREDENTIAL_PREFIX or not body:
            raise ValueError(f"not a credential (it starts {CREDENTIAL_PREFIX}.)")
        try:
            fields = json.loads(_unb64(body))
            role, ident = fields["role"], fields["id"]
            key, cert, root = (_unb64(fields[name]) for name in ("key", "cert", "root"))
        except (ValueError, KeyError, TypeError, RecursionError, binascii.Error):  # RecursionError: [[[[...
            raise ValueError("not a credential: its body is not what `megha credential` writes") from None
        if role not in SERVICE_ROLES or not isinstance(ident, str) or not SERVICE_ID.match(ident):
            raise ValueError("not a credential: no service role and id")
        if len(key) != 32 or len(root) != 32:
            raise ValueError("not a credential: its keys are not Ed25519 keys")
        public = _raw(_private_key(key).public_key())
        if not _verifies(_public_key(root), cert, _certified(role, ident, public)):
            raise ValueError(f"the credential of {role} {ident} is not certified by its root key")
        return cls(role, ident, key, cert, root)


class Signer:
    """Makes the signed tokens of one service, a fresh one every `RENEW_AFTER` seconds."""

    def __init__(self, credential: Credential) -> None:
        self.role = credential.role
        self.ident = credential.ident
        self._key = _private_key(credential.key)
        self._public = _b64(_raw(self._key.public_key()))
        self._certificate = _b64(credential.certificate)
        self._header = ""
        self._renew_at = 0.0

    def token(self, now: float) -> str:
        claim = {"role": self.role, "id": self.ident, "pub": self._public, "cert": self._certificate}
        claim["exp"] = int(now + TOKEN_LIFETIME)  # type: ignore[assignment]
        body = _b64(json.dumps(claim, separators=(",", ":")).encode())
        return f"{PREFIX}.{body}.{_b64(self._key.sign(body.encode()))}"

    def header(self) -> str:
        """The `Authorization` header value to send now."""
        now = time.time()
        if now >= self._renew_at:
            self._header = f"{SCHEME} {self.token(now)}"
            self._renew_at = now + RENEW_AFTER
        return self._header


class Verifier:
    """Checks bearer tokens: services' signed tokens against the deployment's root public key, users' API tokens
    against their digests. Tokens already verified are remembered until they expire, so a request costs a dict
    lookup."""

    def __init__(
        self, root: bytes | None, api_tokens: dict[str, str] | None = None, operators: frozenset[str] = frozenset()
    ):
        """`root`: the root public key services' tokens must chain to (None: no service token is accepted)."""
        self._root = None if root is None else _public_key(root)
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
        if len(token) > MAX_TOKEN_CHARS:
            raise Unauthenticated(f"token longer than {MAX_TOKEN_CHARS} characters")
        known = self._known.get(token)
        if known is not None and now < known[1]:
            return known[0]
        principal, until = self._service(token, now) if token.startswith(PREFIX + ".") else self._user(token, now)
        if len(self._known) >= 4096:
            self._known = {t: k for t, k in self._known.items() if now < k[1]}
        self._known[token] = (principal, until)
        return principal

    def _service(self, token: str, now: float) -> tuple[Principal, float]:
        parts = token.split(".")
        try:
            if len(parts) != 3:
                raise ValueError(len(parts))
            body, signature = parts[1], parts[2]
            claim = json.loads(_unb64(body))
            role, ident, expires = claim["role"], claim["id"], claim["exp"]
            public, cert, mac = _unb64(claim["pub"]), _unb64(claim["cert"]), _unb64(signature)
            if role not in SERVICE_ROLES or not isinstance(ident, str) or not SERVICE_ID.match(ident):
                raise ValueError(role)
            if not isinstance(expires, int) or len(public) != 32:
                raise ValueError(expires)
        except (ValueError, KeyError, TypeError, RecursionError, binascii.Error):  # RecursionError: [[[[...
            raise Unauthenticated("malformed service token") from None
        if self._root is None:
            raise Unauthenticated("this service accepts no service token")
        if not _verifies(self._root, cert, _certified(role, ident, public)):
            raise Unauthenticated("service token's key is not certified by this deployment's root key")
        if not _verifies(_public_key(public), mac, body.encode()):
            raise Unauthenticated("service token not signed with its certified key")
        if expires <= now:
            raise Unauthenticated("service token expired")
        if expires > now + TOKEN_LIFETIME + CLOCK_SKEW:
            raise Unauthenticated("service token valid for longer than allowed (clock skew?)")
        return Principal(role, ident), float(expires)

    def _user(self, token: str, now: float) -> tuple[Principal, float]:
        user = self._users.get(token_digest(token))
        if user is None:
            raise Unauthenticated("unknown API token")
        return Principal("user", user, operator=user in self._operators), now + RENEW_AFTER


class MessageSigner:
    """Signs a service's broker messages with its own key. `certificate` (its role, id, public key and the root's
    certificate of them, one line) travels with each message, so that a receiver trusting the root can check it."""

    def __init__(self, credential: Credential) -> None:
        self.ident = credential.ident
        self._key = _private_key(credential.key)
        public = _b64(_raw(self._key.public_key()))
        self.certificate = f"{credential.role} {credential.ident} {public} {_b64(credential.certificate)}"

    def sign(self, data: bytes) -> str:
        """This service's signature of `data` (base64)."""
        return _b64(self._key.sign(data))


class MessageVerifier:
    """Checks broker messages a `MessageSigner` of role `role` signed: the certificate against the deployment's root
    key, then the signature against the certified key. Certificates that passed are remembered (by what they
    decode to, however they were spelt; the root issues one per service, so they are few), so a message costs one
    Ed25519 verification."""

    def __init__(self, root: bytes, role: Role) -> None:
        self._root = _public_key(root)
        self.role = role
        self._certified: dict[tuple[str, bytes, bytes], Ed25519PublicKey] = {}  # (id, public key, cert) -> key

    def signer(self, certificate: str, signature: str, data: Callable[[str], bytes]) -> str:
        """The id of the service that `certificate` certifies, when `signature` is its signature of `data(its id)`;
        Unauthenticated says why not."""
        ident, key = self._check(certificate)
        try:
            mac = _unb64(signature)
        except (ValueError, binascii.Error):
            raise Unauthenticated("its signature is malformed") from None
        if not _verifies(key, mac, data(ident)):
            raise Unauthenticated(f"its signature is not {self.role} {ident}'s for this receiver")
        return ident

    def _check(self, certificate: str) -> tuple[str, Ed25519PublicKey]:
        parts = certificate.split(" ")
        try:
            if len(parts) != 4 or not SERVICE_ID.match(parts[1]):
                raise ValueError(len(parts))
            role, ident, public, cert = parts[0], parts[1], _unb64(parts[2]), _unb64(parts[3])
            if len(public) != 32:
                raise ValueError(len(public))
        except (ValueError, binascii.Error):
            raise Unauthenticated("its certificate is malformed") from None
        if role != self.role:
            raise Unauthenticated(f"its certificate is of role {role[:16]!r}, not {self.role!r}")
        known = self._certified.get((ident, public, cert))
        if known is not None:
            return ident, known
        if not _verifies(self._root, cert, _certified(role, ident, public)):
            raise Unauthenticated(f"its certificate of {role} {ident} is not signed by this deployment's root key")
        key = self._certified[(ident, public, cert)] = _public_key(public)
        return ident, key
