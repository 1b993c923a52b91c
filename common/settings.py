"""Service configuration: one pydantic settings model per service, read from MEGHA_* environment variables.

The same names are used by docker-compose.yml, the local launcher (`megha local`) and the docs.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Literal, Self, TypeVar

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from megha.common.core.constraints import NUM_CONSTRAINTS
from megha.common.core.fairness.config import FairnessConfig, parse_queues

if TYPE_CHECKING:
    from megha.common.transport.rabbit import Broker


class ServiceSettings(BaseSettings):
    """Settings every service shares."""

    model_config = SettingsConfigDict(env_prefix="MEGHA_", extra="ignore")

    amqp_url: str = Field("amqp://guest:guest@127.0.0.1:5672/", description="RabbitMQ connection URL")
    host: str = Field("127.0.0.1", description="address the HTTP server binds")
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
        60.0, gt=0, description="seconds to keep retrying RabbitMQ at start-up before exiting with an error"
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

    def url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"

    def broker(self) -> Broker:
        """This service's connection to RabbitMQ, configured from these settings."""
        from megha.common.transport.rabbit import Broker

        return Broker(self.amqp_url, self.run_id, outbox_bytes=self.outbox_bytes, connect_timeout=self.broker_timeout)


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


class GMSettings(FairSettings):
    """A Global Master."""

    gm_id: int = Field(0, ge=0, description="this GM's id, 0..G-1")
    lm_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["http://127.0.0.1:8100"],
        description="every LM's URL, in LM-id order (JSON list or comma-separated)",
    )
    matching: Literal["random", "min-constraints"] = Field(
        "random", description="how the GM picks a worker among those that meet a task's constraints"
    )
    seed: int = Field(0, description="seed of the GM's random choices")
    http_timeout: float = Field(10.0, gt=0, description="seconds for one LM call")
    lm_timeout: float = Field(
        60.0,
        gt=0,
        description="seconds to wait for an unreachable or restarting LM: at start-up, and for a launch in flight "
        "before its tasks are failed",
    )
    journal_dir: str = Field(
        "megha-journal",
        description="folder of the GM's write-ahead journal <run>.gm-<id>.journal (a volume in containers): accepted "
        "jobs are on disk before the 201, and a restarted GM recovers them; empty: no journal (a GM crash then "
        "loses its queued jobs)",
    )
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
        "next GM, which stands in for it when it stays down; empty: no GM stands in for another",
    )
    takeover_after: float = Field(
        45.0,
        ge=0,
        description="seconds the previous GM must stay unreachable before this GM stands in for it (serves its "
        "queue and jobs until it returns); 0: never",
    )

    @field_validator("lm_urls", "gm_urls", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return [u.strip() for u in value.split(",") if u.strip()] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check_peers(self) -> Self:
        if self.gm_urls and self.gm_id >= len(self.gm_urls):
            raise ValueError(f"MEGHA_GM_ID={self.gm_id} has no URL in MEGHA_GM_URLS ({len(self.gm_urls)} listed)")
        return self

    def peer(self, step: int) -> int | None:
        """The GM `step` places after this one in the ring of MEGHA_GM_URLS (None without peers)."""
        n = len(self.gm_urls)
        return (self.gm_id + step) % n if n > 1 else None


class LMSettings(FairSettings):
    """A Local Master."""

    port: int = Field(8100, ge=1, le=65535)
    lm_id: int = Field(0, ge=0, description="this LM's id, 0..L-1")
    num_gms: int = Field(1, ge=1, description="GMs in the deployment: the LM's cluster has one partition per GM")
    expected_nodes: int = Field(1, ge=1, description="nodes worker agents must register before launches are served")
    delta_interval: float = Field(1.0, gt=0, description="seconds between delta updates to each GM")
    http_timeout: float = Field(10.0, gt=0, description="seconds for one worker-agent call")
    worker_timeout: float = Field(
        30.0,
        gt=0,
        description="seconds without a heartbeat after which an agent that fails its health check loses its nodes "
        "and its tasks are reported failed",
    )


class WorkerSettings(ServiceSettings):
    """A worker agent: one node, or many in simulated-execution mode."""

    port: int = Field(8200, ge=1, le=65535)
    worker_id: str = Field(
        "worker-0", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="this agent's name, unique in the deployment"
    )
    lm_url: str = Field("http://127.0.0.1:8100", description="URL of the LM this agent registers with")
    execution: Literal["real", "simulated"] = Field(
        "real", description="real: each task burns its CPU and memory in its own process; simulated: no burn"
    )
    nodes: int = Field(1, ge=1, description="nodes this agent stands for (more than one needs simulated execution)")
    node_cpu_millicores: int = Field(2000, gt=0, description="CPU of each node, millicores")
    node_memory_mb: int = Field(4096, gt=0, description="memory of each node, MB")
    constraints: Annotated[list[int], NoDecode] = Field(
        default_factory=list, description="machine constraint ids of this agent's nodes"
    )
    heartbeat_interval: float = Field(5.0, gt=0, description="seconds between heartbeats to the LM")
    constraint_seed: int | None = Field(
        None, description="draw each node's constraints with the published machine fractions instead"
    )

    @field_validator("constraints", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return [int(c) for c in value.split(",") if c.strip()] if isinstance(value, str) else value

    @field_validator("constraints")
    @classmethod
    def _in_range(cls, value: list[int]) -> list[int]:
        bad = [c for c in value if not 0 <= c < NUM_CONSTRAINTS]
        if bad:
            raise ValueError(f"constraint ids {bad} outside 0..{NUM_CONSTRAINTS - 1}")
        return value


class LoadgenSettings(FairSettings):
    """The request generator: replays a trace against the GM services in open loop and reports."""

    gm_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["http://127.0.0.1:8000"], description="every GM's URL (JSON list or comma-separated)"
    )
    trace: str = Field("demo", description="a .tr file, 'demo' or syn:<tasks>:<jobs>")
    first_jobs: int | None = Field(None, ge=1, description="replay only the first N jobs (all when unset)")
    time_scale: float = Field(1.0, gt=0, description="multiplies arrival times and durations")
    mode: Literal["slot", "scaled"] = Field(
        "scaled", description="slot: a task holds a whole node; scaled: scaled-down Google-like requests"
    )
    seed: int = Field(0, description="seed of the tasks' requests and constraints")
    node_cpu_millicores: int = Field(2000, gt=0, description="slot mode: what one task asks for")
    node_memory_mb: int = Field(4096, gt=0, description="slot mode: what one task asks for")
    cpu_scale: int = Field(400, ge=1, description="scaled mode: divide the drawn CPU request by this")
    mem_scale: int = Field(50, ge=1, description="scaled mode: divide the drawn memory request by this")
    out: str = Field("out/services", description="directory for the report files")
    timeout: float = Field(600.0, gt=0, description="seconds to wait for every task to finish after the last submit")

    @field_validator("gm_urls", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return [u.strip() for u in value.split(",") if u.strip()] if isinstance(value, str) else value


S = TypeVar("S", bound=BaseSettings)


def load_settings(model: type[S], command: str) -> S:
    """`model` from the MEGHA_* environment, or one line naming each bad variable and exit status 2."""
    try:
        return model()
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
