"""Service configuration: one pydantic settings model per service, read from MEGHA_* environment variables.

The same names are used by docker-compose.yml, the local launcher (`megha local`) and the docs.
"""

from __future__ import annotations

import hmac
import json
import os
import ssl
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self, TypeVar
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from megha.common.auth import MIN_SECRET_CHARS, Credential, Signer, Verifier, parse_api_tokens, root_public
from megha.common.checks import check_host, check_http_urls, read_secret_file
from megha.common.clusterfile import MAX_LM_NODES, MAX_NODE_CAPACITY
from megha.common.core.constraints import NUM_CONSTRAINTS
from megha.common.core.fairness.config import FairnessConfig, parse_queues
from megha.common.core.policies import QUEUE_ORDERS
from megha.common.core.policies.priority import (
    DEFAULT_PRIORITY_CLASSES,
    PriorityClasses,
    parse_class_users,
    parse_priority_classes,
)
from megha.common.core.task import DRIVERS
from megha.common.limits import MAX_GMS, MAX_WAIT_SECONDS, MIN_INTERVAL

if TYPE_CHECKING:
    from megha.common.transport.rabbit import Broker


SECRET_SETTINGS = ("amqp_url", "cluster_secret", "credential", "api_tokens", "api_token")
"""Settings that may instead be read from a file named by MEGHA_<NAME>_FILE (a Docker secret, say), so that the
secret is in no environment listing."""


class SecretFileError(ValueError):
    """A MEGHA_<NAME>_FILE that cannot be used."""


class FileSecrets(PydanticBaseSettingsSource):
    """MEGHA_<NAME>_FILE for each of `SECRET_SETTINGS`: the file's content, without surrounding white space."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads every secret at once

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name in SECRET_SETTINGS:
            if name not in self.settings_cls.model_fields:
                continue
            variable = f"MEGHA_{name.upper()}"
            path = os.environ.get(f"{variable}_FILE")
            if not path:
                continue
            if os.environ.get(variable):
                raise SecretFileError(f"{variable} and {variable}_FILE are both set: set one")
            try:
                values[name] = read_secret_file(path)
            except (OSError, UnicodeDecodeError) as exc:
                raise SecretFileError(f"{variable}_FILE: cannot read {path}: {exc}") from None
        return values


class ServiceSettings(BaseSettings):
    """Settings every service shares."""

    model_config = SettingsConfigDict(env_prefix="MEGHA_", extra="ignore", allow_inf_nan=False)

    signs_as: ClassVar[Literal["gm", "lm", "worker"] | None] = None
    """The role this service's signed tokens name (None: a client, not a service: it holds no cluster secret)."""
    broker_role: ClassVar[str | None] = None
    """The role this service connects to RabbitMQ as (megha.common.transport.rabbit.ROLE_EXCHANGES: the exchanges
    it declares); None: every exchange of the run."""

    auth: Literal["on", "off"] = Field(
        "on",
        description="on: every route but /healthz, /metrics, /docs and the dashboard's page needs a credential "
        "(users an API token, services a token signed with MEGHA_CLUSTER_SECRET); off: none is checked and anyone "
        "who reaches a port can submit, launch, preempt and cancel: for a development run only, logged as a warning "
        "at start-up (docs/security.md)",
    )
    credential: SecretStr = Field(
        SecretStr(""),
        description="this service's own credential (its Ed25519 key, certified by the deployment's root key), with "
        "which it signs its calls to other services and checks theirs: it can sign as this service only; made by "
        "`megha credential`, `megha local`, the compose demo and the swarm stack; required while MEGHA_AUTH=on "
        "unless MEGHA_CLUSTER_SECRET is given; MEGHA_CREDENTIAL_FILE names a file holding it instead (a Docker "
        "secret)",
    )
    cluster_secret: SecretStr = Field(
        SecretStr(""),
        description=f"the deployment's root secret (at least {MIN_SECRET_CHARS} characters), from which every "
        "service's credential is issued; for the tools that issue credentials. A service given it instead of "
        "MEGHA_CREDENTIAL issues its own credential from it and warns at start-up: whoever holds it can sign as "
        "any service (docs/security.md); MEGHA_CLUSTER_SECRET_FILE names a file holding it instead",
    )

    amqp_url: str = Field(
        "amqp://guest:guest@127.0.0.1:5672/",
        description="RabbitMQ connection URL (amqps:// for TLS, verified with MEGHA_TLS_CA); the default, RabbitMQ's "
        "guest account on this machine, is for a development run only: a deployment gives each role its own user "
        "(docs/security.md); MEGHA_AMQP_URL_FILE names a file holding it instead (a Docker secret)",
    )
    host: str = Field(
        "127.0.0.1", min_length=1, description="address the HTTP server binds (an IP address or a host name)"
    )

    @field_validator("host")
    @classmethod
    def _check_host(cls, value: str) -> str:
        return check_host(value)

    port: int = Field(8000, ge=1, le=65535, description="HTTP port")
    public_url: str = Field("", description="URL other services use to reach this one (default http://host:port)")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")
    log_format: Literal["text", "json"] = Field(
        "text",
        description="format of every log line, uvicorn's included: text (time, service, level, logger: message) or "
        "json (one object per line: time, level, logger, service, message, fields given with extra=, exc_info); "
        "at log level debug, uvicorn's access log adds a line per request",
    )
    run_id: str = Field(
        "megha",
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="prefix of exchanges and queues, so deployments on one broker do not mix",
    )

    broker_timeout: float = Field(
        60.0,
        gt=0,
        le=MAX_WAIT_SECONDS,
        description="seconds to keep retrying RabbitMQ at start-up before exiting with an error (at most a day)",
    )
    outbox_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="bytes of messages held for RabbitMQ while it is away (publishers wait beyond, never drop)",
    )

    queue_type: Literal["classic", "quorum"] = Field(
        "classic",
        description="type of the durable queues this service declares: quorum for a RabbitMQ cluster "
        "(docs/reliability.md)",
    )

    tls_cert: str = Field(
        "",
        description="PEM certificate (chain) this service serves HTTPS with, with MEGHA_TLS_KEY; its default public "
        "URL is then https:// (docs/security.md, TLS); empty: plain HTTP",
    )
    tls_key: str = Field("", description="PEM private key (unencrypted) of MEGHA_TLS_CERT")
    tls_ca: str = Field(
        "",
        description="PEM bundle of the certificate authorities that verify the HTTPS services this one calls and an "
        "amqps:// broker; empty: the system's",
    )

    @field_validator("amqp_url")
    @classmethod
    def _check_amqp_url(cls, value: str) -> str:
        return check_amqp_url(value)

    @field_validator("public_url")
    @classmethod
    def _check_public_url(cls, value: str) -> str:
        return check_http_urls([value])[0] if value else value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, FileSecrets(settings_cls), dotenv_settings, file_secret_settings

    @model_validator(mode="after")
    def _check_auth(self) -> Self:
        secret = self.cluster_secret.get_secret_value()
        if secret and len(secret) < MIN_SECRET_CHARS:
            raise ValueError(f"MEGHA_CLUSTER_SECRET needs at least {MIN_SECRET_CHARS} characters")
        if self.auth == "on" and self.signs_as is not None:
            if not self.credential.get_secret_value() and not secret:
                raise ValueError(
                    "MEGHA_CREDENTIAL (or MEGHA_CREDENTIAL_FILE) is not set: services sign their calls with it; "
                    "`megha credential`, `megha local` and the compose demo make one (docs/security.md); "
                    "MEGHA_AUTH=off runs without authentication, for development only"
                )
            own = self.own_credential()
            if (own.role, own.ident) != (self.signs_as, self.ident()):
                raise ValueError(
                    f"MEGHA_CREDENTIAL is the credential of {own.role} {own.ident}, not of this {self.signs_as} "
                    f"{self.ident()}"
                )
        return self

    def own_credential(self) -> Credential:
        """This service's credential: MEGHA_CREDENTIAL, else issued from MEGHA_CLUSTER_SECRET. ValueError says what
        is wrong with it."""
        if self.signs_as is None:
            raise ValueError("a client holds no service credential")
        text = self.credential.get_secret_value()
        if text:
            try:
                return Credential.decode(text)
            except ValueError as exc:
                raise ValueError(f"MEGHA_CREDENTIAL: {exc}") from None
        return Credential.issue(self.cluster_secret.get_secret_value(), self.signs_as, self.ident())

    def holds_root(self) -> bool:
        """Whether this service signs with a credential it issued itself from the cluster secret (it then could sign
        as any service: a deployment gives each service only its own MEGHA_CREDENTIAL)."""
        return self.auth == "on" and self.signs_as is not None and not self.credential.get_secret_value()

    @model_validator(mode="after")
    def _check_tls(self) -> Self:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("MEGHA_TLS_CERT and MEGHA_TLS_KEY go together: set both (HTTPS) or neither (plain HTTP)")
        try:
            if self.tls_cert:
                what = f"MEGHA_TLS_CERT={self.tls_cert} with MEGHA_TLS_KEY={self.tls_key}"
                ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.tls_cert, self.tls_key, password="")
            if self.tls_ca:
                what = f"MEGHA_TLS_CA={self.tls_ca}"
                ssl.create_default_context(cafile=self.tls_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"{what}: {exc.strerror or exc}") from None
        return self

    def signer(self) -> Signer | None:
        """This service's token signer (None with MEGHA_AUTH=off, or for a client)."""
        if self.auth == "off" or self.signs_as is None:
            return None
        return Signer(self.own_credential())

    def ident(self) -> str:
        """This service's id in the tokens it signs."""
        return "-"

    def credentials(self) -> Callable[[], str] | None:
        """The `Authorization` header value of this process's calls to other services, made afresh as needed
        (None: no header, with MEGHA_AUTH=off)."""
        signer = self.signer()
        return None if signer is None else signer.header

    def trusted_root(self) -> bytes | None:
        """The root public key services' tokens must chain to (None: this process accepts no service token)."""
        if self.signs_as is not None:
            return self.own_credential().root
        secret = self.cluster_secret.get_secret_value()
        return root_public(secret) if secret else None

    def verifier(self) -> Verifier | None:
        """Checks the credentials of requests to this service (None with MEGHA_AUTH=off)."""
        if self.auth == "off":
            return None
        return Verifier(self.trusted_root())

    def url(self) -> str:
        return self.public_url or f"{'https' if self.tls_cert else 'http'}://{self.host}:{self.port}"

    def public(self) -> dict[str, Any]:
        """These settings as JSON for a report, without a secret: secret settings left out, and the broker URL's
        password masked."""
        shown = self.model_dump(mode="json", exclude=set(SECRET_SETTINGS) - {"amqp_url"})
        parts = urlsplit(self.amqp_url)
        if parts.password:
            shown["amqp_url"] = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")).geturl()
        return shown

    def broker(self) -> Broker:
        """This service's connection to RabbitMQ, configured from these settings."""
        from megha.common.transport.rabbit import Broker

        return Broker(
            self.amqp_url,
            self.run_id,
            outbox_bytes=self.outbox_bytes,
            connect_timeout=self.broker_timeout,
            role=self.broker_role,
            tls_ca=self.tls_ca or None,
        )


class UserTokens(ServiceSettings):
    """Users' API tokens, which the GMs check on every submission and an operator's token on the LMs and agents
    too (`megha nodes`, the state routes)."""

    api_tokens: SecretStr = Field(
        SecretStr(""),
        description="users' API tokens as user=token entries, separated by commas or new lines (a token may be "
        "given as user=sha256:<hex of its SHA-256>); required on GMs while MEGHA_AUTH=on, optional on LMs and "
        "agents (for operators); MEGHA_API_TOKENS_FILE names a file holding them instead (a Docker secret)",
    )
    operators: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["operator"],
        description="users who act for every user: submit to any queue, see and cancel every job, read the "
        "state of GMs, LMs and agents (the load generator's token is an operator's)",
    )

    @field_validator("operators", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        return [u.strip() for u in value.split(",") if u.strip()] if isinstance(value, str) else value

    @field_validator("api_tokens")
    @classmethod
    def _tokens(cls, value: SecretStr) -> SecretStr:
        parse_api_tokens(value.get_secret_value())
        return value

    def verifier(self) -> Verifier | None:
        if self.auth == "off":
            return None
        tokens = parse_api_tokens(self.api_tokens.get_secret_value())
        return Verifier(self.trusted_root(), tokens, frozenset(self.operators))


class FairSettings(ServiceSettings):
    """Fair scheduling, configured alike on every GM, LM and the request generator."""

    queues: str = Field(
        "",
        description="fair scheduling: user queues as user:share:gm,... e.g. q1:10%:0,q2:90%:1 (empty: off); "
        "the same on every GM, LM and the load generator",
    )
    share_policy: Literal["share", "drf", "demand", "demand-drf"] = Field(
        "share", description="fair scheduling: how consumption is measured and queues are ordered"
    )

    @field_validator("queues")
    @classmethod
    def _parse(cls, value: str) -> str:
        if value:
            parse_queues(value)
        return value

    def fairness(self) -> FairnessConfig | None:
        return parse_queues(self.queues, self.share_policy) if self.queues else None

    def check_queue_gms(self, num_gms: int, given_by: str) -> None:
        """ValueError naming MEGHA_QUEUES when it maps a queue to a GM beyond the `num_gms` that `given_by` says
        the deployment has."""
        fairness = self.fairness()
        if fairness is not None:
            try:
                fairness.check_gms(num_gms)
            except ValueError as exc:
                raise ValueError(f"MEGHA_QUEUES: {exc} ({given_by})") from None


class PrioritySettings(ServiceSettings):
    """Priority classes, configured alike on every GM and LM (docs/priority.md)."""

    priority_classes: str = Field(
        DEFAULT_PRIORITY_CLASSES,
        description="priority classes as name:value,... (a higher value is served first and may preempt lower "
        "ones); a job names one as `priority_class`, else gets `normal` (or the lowest class when none is named "
        "normal)",
    )

    @field_validator("priority_classes")
    @classmethod
    def _parse_classes(cls, value: str) -> str:
        parse_priority_classes(value)
        return value

    def classes(self) -> PriorityClasses:
        return parse_priority_classes(self.priority_classes)


class ClassUserSettings(PrioritySettings):
    """Who may name the priority classes that preempt others (docs/priority.md, "Who may name a class")."""

    priority_class_users: str = Field(
        "",
        description="with authentication on, the users who may name each class above the default one, as "
        "class:user+user,... (e.g. high:alice+bob; a user listed twice for one class is refused, one listed for two "
        "classes may name each); a class above the default that is not listed is for operators only, and every user "
        "may name the default class and those below it",
    )

    @model_validator(mode="after")
    def _parse_class_users(self) -> Self:
        try:
            parse_class_users(self.priority_class_users, self.classes())
        except ValueError as exc:
            raise ValueError(f"MEGHA_PRIORITY_CLASS_USERS: {exc}") from None
        if (twice := _class_user_twice(self.priority_class_users)) is not None:
            name, user = twice
            raise ValueError(f"MEGHA_PRIORITY_CLASS_USERS: user {user!r} listed twice for class {name!r}; list it once")
        return self

    def class_users(self) -> dict[str, frozenset[str]]:
        return parse_class_users(self.priority_class_users, self.classes())


def _class_user_twice(text: str) -> tuple[str, str] | None:
    """The first (class, user) that MEGHA_PRIORITY_CLASS_USERS (`class:user+user,...`, checked by
    `parse_class_users`) lists twice, in one item or in two items of that class; None when none is. One user listed
    for two classes is no repeat: it may name each (a class allows only the users listed for it)."""
    seen: set[tuple[str, str]] = set()
    for item in text.split(","):
        name, _, listed = item.partition(":")
        for user in (u.strip() for u in listed.split("+") if u.strip()):
            if (pair := (name.strip(), user)) in seen:
                return pair
            seen.add(pair)
    return None


class GMSettings(FairSettings, ClassUserSettings, UserTokens):
    """A Global Master."""

    signs_as = "gm"
    broker_role = "gm"

    gm_id: int = Field(0, ge=0, description="this GM's id, 0..G-1")
    lm_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["http://127.0.0.1:8100"],
        description="every LM's URL, in LM-id order (JSON list or comma-separated)",
    )
    matching: Literal["random", "min-constraints", "min-constraints-first", "first-fit", "scarcity", "rarity"] = Field(
        "random",
        description="how the GM picks a worker among those that meet a task's constraints; min-constraints-first: "
        "Minimum-Constraints with ties to the lowest index (the authors' simulator); scarcity: one without the "
        "constraints in short supply the task does not need, at random among those; rarity: among those with the "
        "fewest constraints the task does not need, as scarcity (docs/lm-order.md)",
    )
    lm_order: Literal["round-robin", "first-fit", "scarcity", "rarity"] = Field(
        "round-robin",
        description="the order the GM searches LMs' partitions: round-robin from the next LM for each task (the "
        "paper), LM 0 first for every task (the authors' simulator), scarcity: first where the task takes the "
        "fewest free nodes with constraints in short supply, or rarity: first where its best node has the fewest "
        "constraints it does not need (docs/lm-order.md)",
    )
    unplaceable: Literal["park", "park-freed-node", "requeue-back"] = Field(
        "park",
        description="a task that fits nowhere now: parked by shape until a node it could use frees up, parked so that "
        "a freed node goes to the first parked task it fits, on that node (the authors' simulator), or put at the "
        "back of its queue and tried again in the next scheduling pass (the fair paper, section IV-B5)",
    )
    queue_order: str = Field(
        "fifo",
        description="the order the GM serves its queue without fair scheduling: fifo (tasks in arrival order), users "
        "(users in turns, each user's tasks in arrival order: one user's large job does not keep another's tasks "
        "behind it) or another name registered in megha.common.core.policies.QUEUE_ORDERS (fair scheduling serves "
        "its user queues instead)",
    )
    gang_reserve_after: float | None = Field(
        None,
        gt=0,
        description="seconds the gang that has waited longest at this GM waits before the GM holds LMs for it: it "
        "places no other task of the same or a lower priority on them until the gang is placed, so that wide gangs "
        "do not starve behind streams of small jobs (docs/gang.md, Starvation); empty: never",
    )

    @field_validator("queue_order")
    @classmethod
    def _known_queue_order(cls, value: str) -> str:
        if value not in QUEUE_ORDERS:
            raise ValueError(f"unknown queue order {value!r}; choose one of {sorted(QUEUE_ORDERS)}")
        return value

    seed: int = Field(0, description="seed of the GM's random choices")
    http_timeout: float = Field(10.0, gt=0, le=MAX_WAIT_SECONDS, description="seconds for one LM call")
    lm_timeout: float = Field(
        60.0,
        gt=0,
        le=MAX_WAIT_SECONDS,
        description="seconds to wait for an unreachable or restarting LM: at start-up, and for a launch in flight "
        "before its tasks are run again as their next attempt (the LM may have launched them)",
    )
    lm_lost_after: float = Field(
        300.0,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description="seconds an LM may stay unreachable before this GM gives up its runs there: each runs again as "
        "its next attempt elsewhere, and is stopped there if the LM comes back (0: never give them up)",
    )
    journal_dir: str = Field(
        "megha-journal",
        description="folder of the GM's write-ahead journal <run>.gm-<id>.journal (a volume in containers): accepted "
        "jobs are on disk before the 201, and a restarted GM recovers them; empty: no journal (a GM crash then "
        "loses its queued jobs)",
    )

    @field_validator("journal_dir")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if value and not value.strip():
            raise ValueError("is only blanks: name a folder, or leave it empty for no journal")
        return value

    max_attempts: int = Field(
        3, ge=1, description="executions of a task whose worker is lost before it is failed with the reason"
    )
    finished_tasks_kept: int = Field(
        1_000_000,
        ge=0,
        description="finished tasks GET /v1/jobs/{id} keeps; the oldest finished jobs beyond are forgotten",
    )
    max_unfinished_tasks_per_user: int = Field(
        100_000,
        ge=0,
        description="tasks of one user this GM holds unfinished (queued, placed or running) at most: a job that would "
        "exceed it gets 429 (submit again once some end), a job larger than it 422; 0: no limit",
    )
    gm_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="every GM's URL, in GM-id order (JSON list or comma-separated): a GM copies its journal to the "
        "next GM, which stands in for it when it stays down, and asks the GM of a job its jobs depend on; empty: no GM "
        "stands in for another, nor finds another's jobs",
    )
    dependency_poll: float = Field(
        5.0,
        ge=MIN_INTERVAL,
        le=MAX_WAIT_SECONDS,
        description="seconds between this GM's checks of the parents its waiting jobs wait for at other GMs "
        "(depends_on; docs/dependencies.md): how late, at most, a child learns a remote parent ended (at "
        f"least {MIN_INTERVAL:g})",
    )
    takeover_after: float = Field(
        45.0,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description="seconds the previous GM must stay unreachable before this GM stands in for it (serves its "
        "queue and jobs until it returns); 0: never",
    )
    metrics_user_labels: bool = Field(
        False,
        description="whether GET /metrics (which needs no login) names each user queue in its `queue` label; false: "
        "a queue is labelled #1, #2, ... by its place in MEGHA_QUEUES",
    )

    @field_validator("lm_urls", "gm_urls", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return split_urls(value)

    @field_validator("lm_urls", "gm_urls")
    @classmethod
    def _check_urls(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if info.field_name == "lm_urls" and not value:
            raise ValueError("lists no LM: give every LM's URL, in LM-id order")
        return check_http_urls(value)

    @model_validator(mode="after")
    def _check_peers(self) -> Self:
        if self.gm_urls and self.gm_id >= len(self.gm_urls):
            raise ValueError(f"MEGHA_GM_ID={self.gm_id} has no URL in MEGHA_GM_URLS ({len(self.gm_urls)} listed)")
        if self.gm_urls:
            self.check_queue_gms(len(self.gm_urls), "MEGHA_GM_URLS")
        if self.queues and self.queue_order != "fifo":
            raise ValueError(
                f"MEGHA_QUEUE_ORDER={self.queue_order} does not apply with MEGHA_QUEUES: fair scheduling serves its "
                "user queues in its own order; leave MEGHA_QUEUE_ORDER unset"
            )
        if self.auth == "on" and not parse_api_tokens(self.api_tokens.get_secret_value()):
            raise ValueError(
                "MEGHA_API_TOKENS (or MEGHA_API_TOKENS_FILE) names no user token while MEGHA_AUTH=on: nobody could "
                "submit (docs/security.md)"
            )
        return self

    def ident(self) -> str:
        return str(self.gm_id)

    def peer(self, step: int) -> int | None:
        """The GM `step` places after this one in the ring of MEGHA_GM_URLS (None without peers)."""
        n = len(self.gm_urls)
        return (self.gm_id + step) % n if n > 1 else None


class LMSettings(FairSettings, PrioritySettings, UserTokens):
    """A Local Master."""

    signs_as = "lm"
    broker_role = "lm"

    port: int = Field(8100, ge=1, le=65535)
    lm_id: int = Field(0, ge=0, description="this LM's id, 0..L-1")
    num_gms: int = Field(
        1, ge=1, le=MAX_GMS, description="GMs in the deployment: the LM's cluster has one partition per GM"
    )
    expected_nodes: int = Field(
        1, ge=1, le=MAX_LM_NODES, description="nodes worker agents must register before launches are served"
    )
    delta_interval: float = Field(
        1.0,
        ge=MIN_INTERVAL,
        le=MAX_WAIT_SECONDS,
        description=f"seconds between delta updates to each GM (at least {MIN_INTERVAL:g})",
    )
    http_timeout: float = Field(10.0, gt=0, le=MAX_WAIT_SECONDS, description="seconds for one worker-agent call")
    worker_timeout: float = Field(
        30.0,
        ge=MIN_INTERVAL,
        le=MAX_WAIT_SECONDS,
        description="seconds without a heartbeat after which an agent that fails its health check loses its nodes "
        f"and its tasks are reported failed (checked every quarter of it, at most 5 s; at least {MIN_INTERVAL:g})",
    )
    queueable_per_node: int = Field(
        4,
        ge=1,
        description="queueable tasks (waiting or running) this LM holds per node and per GM; beyond, it refuses one "
        "as a full queue and its GM tries another node (docs/queueable.md)",
    )

    @model_validator(mode="after")
    def _check_queue_gms(self) -> Self:
        self.check_queue_gms(self.num_gms, f"MEGHA_NUM_GMS={self.num_gms}")
        return self

    def ident(self) -> str:
        return str(self.lm_id)

    def report_secret(self) -> bytes:
        """The key this LM derives each agent's broker-report key from: its own credential's, so the same across
        restarts of this LM and unknown to the agents (each learns only its own derived key when it registers).
        Empty with MEGHA_AUTH=off (nothing is signed)."""
        if self.auth == "off":
            return b""
        return hmac.new(self.own_credential().key, b"megha broker reports", "sha256").digest()


class WorkerSettings(UserTokens):
    """A worker agent: one node, or many in simulated-execution mode."""

    signs_as = "worker"
    broker_role = "worker"

    port: int = Field(8200, ge=1, le=65535)
    worker_id: str = Field(
        "worker-0", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="this agent's name, unique in the deployment"
    )
    lm_url: str = Field("http://127.0.0.1:8100", description="URL of the LM this agent registers with")

    @field_validator("lm_url")
    @classmethod
    def _check_lm_url(cls, value: str) -> str:
        return check_http_urls([value])[0]

    execution: Literal["real", "simulated"] = Field(
        "real", description="real: each task burns its CPU and memory in its own process; simulated: no burn"
    )
    nodes: int = Field(
        1, ge=1, le=MAX_LM_NODES, description="nodes this agent stands for (more than one needs simulated execution)"
    )

    @field_validator("nodes")
    @classmethod
    def _one_real_node(cls, value: int, info: ValidationInfo) -> int:
        if value != 1 and info.data.get("execution") == "real":
            raise ValueError(f"{value} nodes need MEGHA_EXECUTION=simulated: a real agent is one node")
        return value

    node_cpu_millicores: int = Field(
        2000, gt=0, le=MAX_NODE_CAPACITY, description="CPU of each node, millicores (at most 2**40)"
    )
    node_memory_mb: int = Field(4096, gt=0, le=MAX_NODE_CAPACITY, description="memory of each node, MB (at most 2**40)")
    constraints: Annotated[list[int], NoDecode] = Field(
        default_factory=list, description="machine constraint ids of this agent's nodes, each once"
    )
    heartbeat_interval: float = Field(
        5.0,
        ge=MIN_INTERVAL,
        le=MAX_WAIT_SECONDS,
        description=f"seconds between heartbeats to the LM (at least {MIN_INTERVAL:g})",
    )
    constraint_seed: int | None = Field(
        None, description="draw each node's constraints with the published machine fractions instead"
    )
    drivers: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["burn", "exec"],
        description="task drivers this agent offers (comma-separated: burn, exec, container); container needs a "
        "Docker engine that answers at start-up (DOCKER_HOST); a simulated agent offers only burn (docs/drivers.md)",
    )
    task_uids: str = Field(
        "900000000-900000999",
        pattern=r"^[0-9]+-[0-9]+$",
        description="uids (each also the gid) exec tasks run as, first-last: each running task takes one that no "
        "process has, so tasks cannot read, signal or ptrace the agent or each other; also bounds the exec tasks "
        "running at once on a host. Needs an agent running as root; no user or program of the host may use these "
        "uids (docs/drivers.md)",
    )
    task_uid_wait: float = Field(
        60.0,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description="seconds an exec task placed on a host whose task uids (MEGHA_TASK_UIDS) are all taken waits for "
        "one, in line with the others waiting, before it fails saying so (0: it fails at once)",
    )
    task_max_processes: int = Field(
        512,
        ge=1,
        description="processes and threads one exec or container task may have at once (exec: RLIMIT_NPROC of its "
        "own uid; container: the engine's pids limit); a fork bomb stops there",
    )
    task_max_files: int = Field(
        4096,
        ge=64,
        description="descriptors (open files, sockets, pipes) one exec or container task may hold open: each of its "
        "processes at most this many (exec: RLIMIT_NOFILE, or the agent's own hard limit when lower; container: the "
        "nofile ulimit), and under rlimits all of an exec task's processes together, or the agent kills it",
    )
    task_max_disk_mb: int = Field(
        10240,
        ge=1,
        le=MAX_NODE_CAPACITY,
        description="disk one exec task may fill, MB: each file it writes at most this much (RLIMIT_FSIZE), and the "
        "blocks of its scratch folder, of its uid's files in the host's /tmp and /var/tmp when they are shared and on "
        "disk, and of the removed files on disk it holds open together, or the agent kills it (at most 2**40)",
    )
    task_max_disk_files: int = Field(
        100_000,
        ge=1024,
        description="files and folders one exec task may keep in the places its disk is counted in (its scratch "
        "folder, its uid's in the host's shared /tmp and /var/tmp), or the agent kills it; bounds the inodes it takes "
        "and what the agent's count of its disk costs",
    )
    exec_as_agent_user: bool = Field(
        False,
        description="for an agent that cannot switch uids (not root): offer exec anyway, running every task as the "
        "agent's own user, where tasks can read the agent's secrets (environment, credential files) and each "
        "other's processes; logged as a warning at start-up. Unset, such an agent leaves exec out of the drivers it "
        "offers, saying why in one line at start-up. No effect on an agent that can switch uids",
    )
    container_network: str = Field(
        "bridge",
        min_length=1,
        description="Docker network of container tasks: bridge (the engine's default network: outbound access, and "
        "the host's published ports), none (no network but loopback), or the name of a network",
    )
    task_log_dir: str = Field(
        "",
        description="folder of the kept stdout and stderr of exec and container tasks, the agent's user's alone "
        "(0700; refused at start-up when another user owns it or could swap it, or when others may enter it and it "
        "holds files already) (empty: megha-<uid>/<run id>-<worker id>-task-logs in the system's temp folder)",
    )
    task_log_bytes: int = Field(
        1024 * 1024,
        ge=1,
        description="bytes kept per stream of one task run before it is rotated (once: at most twice this is kept)",
    )
    task_logs_kept: int = Field(1000, ge=1, description="task folders of kept output; the oldest beyond are deleted")

    @field_validator("constraints", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return [int(c) for c in value.split(",") if c.strip()] if isinstance(value, str) else value

    @field_validator("drivers", mode="before")
    @classmethod
    def _split_drivers(cls, value: object) -> object:
        return [d.strip() for d in value.split(",") if d.strip()] if isinstance(value, str) else value

    @field_validator("drivers")
    @classmethod
    def _known_drivers(cls, value: list[str]) -> list[str]:
        unknown = [d for d in value if d not in DRIVERS]
        if unknown or not value:
            raise ValueError(f"{','.join(unknown) or 'nothing'} is not a driver: list some of {', '.join(DRIVERS)}")
        return list(dict.fromkeys(value))

    @field_validator("task_uids")
    @classmethod
    def _uid_range(cls, value: str) -> str:
        first, last = (int(n) for n in value.split("-"))
        if not 0 < first <= last < 2**32 - 1:
            raise ValueError(f"{value}: give first-last with 0 < first <= last < {2**32 - 1} (never root's uid 0)")
        return value

    def task_uid_range(self) -> range:
        """MEGHA_TASK_UIDS as a range."""
        first, last = (int(n) for n in self.task_uids.split("-"))
        return range(first, last + 1)

    def ident(self) -> str:
        return self.worker_id

    @field_validator("constraints")
    @classmethod
    def _in_range(cls, value: list[int]) -> list[int]:
        bad = [c for c in value if not 0 <= c < NUM_CONSTRAINTS]
        if bad:
            raise ValueError(f"constraint ids {bad} outside 0..{NUM_CONSTRAINTS - 1}")
        if twice := sorted({c for c in value if value.count(c) > 1}):
            raise ValueError(f"constraint ids {twice} listed twice: a node has a constraint or not; list each once")
        return value


class LoadgenSettings(FairSettings):
    """The request generator: replays a trace against the GM services in open loop and reports."""

    broker_role = "loadgen"

    gm_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["http://127.0.0.1:8000"], description="every GM's URL (JSON list or comma-separated)"
    )
    trace: str = Field(
        "demo",
        min_length=1,
        description="a .tr file, 'demo' (100 jobs of the Google sub-trace, shipped), or syn:<tasks>:<jobs> (one job "
        "a second of <tasks> 1-second tasks)",
    )
    first_jobs: int | None = Field(None, ge=1, description="replay only the first N jobs (all when unset)")
    time_scale: float = Field(1.0, gt=0, description="multiplies arrival times and durations")
    mode: Literal["slot", "scaled"] = Field(
        "scaled", description="slot: a task holds a whole node; scaled: scaled-down Google-like requests"
    )
    seed: int = Field(0, description="seed of the tasks' requests and constraints")
    gangs: float = Field(
        0.0,
        ge=0,
        le=1,
        description='fraction of jobs (drawn with the seed) submitted as gangs, `"gang": true`: every task of the '
        "job starts or none does (docs/gang.md; as `megha replay --gangs`)",
    )
    node_cpu_millicores: int = Field(2000, gt=0, description="slot mode: what one task asks for")
    node_memory_mb: int = Field(4096, gt=0, description="slot mode: what one task asks for")
    cpu_scale: int = Field(400, ge=1, description="scaled mode: divide the drawn CPU request by this")
    mem_scale: int = Field(50, ge=1, description="scaled mode: divide the drawn memory request by this")
    out: str = Field("out/services", description="directory for the report files")
    timeout: float = Field(
        600.0,
        gt=0,
        le=365 * MAX_WAIT_SECONDS,
        description="seconds to wait for every task to finish after the last submit (at most a year)",
    )
    gm_timeout: float = Field(
        60.0,
        gt=0,
        le=86400,
        description="seconds to keep asking MEGHA_GM_URLS at start-up until a GM answers, before exiting with an "
        "error (in a deployment the generator may start before the GMs)",
    )
    api_token: SecretStr = Field(
        SecretStr(""),
        description="the API token the load generator submits with: an operator's (MEGHA_OPERATORS on the GMs), "
        "since a trace has many users; required while MEGHA_AUTH=on; MEGHA_API_TOKEN_FILE names a file holding it",
    )

    @model_validator(mode="after")
    def _check_token(self) -> Self:
        if self.auth == "on" and not self.api_token.get_secret_value():
            raise ValueError(
                "MEGHA_API_TOKEN (or MEGHA_API_TOKEN_FILE) is not set: the GMs ask every submission for a token "
                "(docs/security.md); MEGHA_AUTH=off if they run without authentication"
            )
        return self

    def credentials(self) -> Callable[[], str] | None:
        """The Authorization header of the load generator's calls: its operator's API token."""
        if self.auth == "off":
            return None
        header = f"Bearer {self.api_token.get_secret_value()}"
        return lambda: header

    @field_validator("gm_urls", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return split_urls(value)

    @field_validator("gm_urls")
    @classmethod
    def _check_urls(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("lists no GM: give every GM's URL, in GM-id order")
        return check_http_urls(value)

    @model_validator(mode="after")
    def _check_queue_gms(self) -> Self:
        self.check_queue_gms(len(self.gm_urls), f"MEGHA_GM_URLS lists {len(self.gm_urls)}")
        return self


def split_urls(value: object) -> object:
    """A list of URLs from the environment, as a JSON list or comma-separated; anything else as it is."""
    if not isinstance(value, str):
        return value
    if value.strip().startswith("["):
        try:
            urls = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"not a JSON list: {exc}") from None
        if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
            raise ValueError("a JSON list of URLs holds strings only")
        return [u.strip() for u in urls if u.strip()]
    return [u.strip() for u in value.split(",") if u.strip()]


def check_amqp_url(url: str) -> str:
    """`url` if it is an amqp:// or amqps:// URL with a host and a port that is a number; otherwise ValueError
    saying what is wrong, without the URL (it may hold a password)."""
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
        got = f"scheme {parts.scheme!r}" if parts.scheme not in ("amqp", "amqps") else "no host"
        raise ValueError(f"not an amqp://user:password@host:port/ (or amqps://) URL: {got if url else 'empty'}")
    try:
        parts.port  # noqa: B018 (a port that is not a number, or beyond 65535, raises ValueError)
    except ValueError:
        raise ValueError("the URL's port is not a number from 0 to 65535") from None
    return url


S = TypeVar("S", bound=BaseSettings)


def load_settings(model: type[S], command: str) -> S:
    """`model` from the MEGHA_* environment, or one line naming each bad variable and exit status 2."""
    try:
        return model()
    except SecretFileError as exc:
        print(f"{command}: bad settings: {exc}", file=sys.stderr)
        sys.exit(2)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            name = "_".join(str(part) for part in error["loc"]).upper()
            message = str(error["msg"]).removeprefix("Value error, ")
            problems.append(f"MEGHA_{name}: {message}" if name else message)
        print(f"{command}: bad settings: {'; '.join(problems)} (see {command} --help)", file=sys.stderr)
        sys.exit(2)


def settings_help(model: type[BaseSettings]) -> str:
    """Every MEGHA_* variable `model` reads, with its default and meaning (the `--help` of a service)."""
    lines = [f"{model.__doc__.strip() if model.__doc__ else model.__name__} Settings (environment variables):", ""]
    for name, field in model.model_fields.items():
        description = next(
            (
                f.description
                for cls in model.__mro__
                if (f := getattr(cls, "model_fields", {}).get(name)) and f.description
            ),
            "",
        )
        default = field.get_default(call_default_factory=True)
        if isinstance(default, list):
            default = ",".join(map(str, default))
        shown = "unset" if default is None else (repr(default) if default == "" else str(default))
        lines.append(f"  MEGHA_{name.upper():<24} default {shown}")
        lines.append(f"      {description}")
    return "\n".join(lines)
