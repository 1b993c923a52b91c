"""The `megha` command line, one click group: `megha replay` replays a trace through the embedded system and prints
the report, `megha local` does so through a deployment of separate processes, `megha gm|lm|worker|loadgen` run the
services, and megha/ctl/'s `megha job|queues|nodes|top` operate a running deployment.

An option that is also a setting is generated from the settings model's field (megha/options.py), so the command
lines and the MEGHA_* variables share one definition of its type, bounds, choices and meaning."""

from __future__ import annotations

import gc
import json
import os
import platform
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, NoReturn

import click

from megha.common.core.costs import PRESETS
from megha.common.core.fairness.config import parse_queues
from megha.common.core.node_table import DELTA_STATES
from megha.common.core.policies import ANSWER_STATES, INCONSISTENT, UNSATISFIABLE, WAITING_ORDERS
from megha.common.core.policies.priority import parse_priority_classes
from megha.common.lifecycle import exit_quietly_if_stdout_closed
from megha.common.machine_classes import MACHINE_DRAWS
from megha.common.transport.inmemory import EVENT_ORDERS, fewer_gc_pauses
from megha.embedded.faults import parse_faults
from megha.loadgen.metrics import RunMetrics
from megha.loadgen.replay import ReplayConfig
from megha.loadgen.trace import MAX_SECONDS
from megha.options import Bounded, Decorator, GroupedCommand, OneOf, option, options, positive, setting, usage_line
from megha.sim.system import SCHEDULERS

if TYPE_CHECKING:
    from megha.loadgen.figure_process import FigureProcess

REPLAY_OUT = Path("out/replay")  # each run's report folder is a new <date>-<time> under it unless --out names one
LOCAL_OUT = Path("out/local")
REPLAY_EXAMPLES = """\
examples:
  megha replay                                   # 200 jobs of syn_250 on a generated 10,000-node cluster
  megha replay --trace ../shared/traces/syn_250.0.tr --first-jobs 200 --cluster reference
  megha replay --trace demo --mode scaled --no-constraints --lms 2 --gms 2 --workers-per-partition 20 \\
      --node-cpu 2000 --node-mem 4096
  megha replay --trace syn:500:100 --matching min-constraints --out out/syn500
  megha replay --cluster reference --trace ../shared/traces/syn_250.0.tr --first-jobs 200 --seeds 3
  megha replay --machine-constraints per-lm --unsatisfiable drop --unplaceable requeue-back
  megha replay --queues A:50%:0,B:50%:0 --job-classes low:50%,high:50%   # priority classes over fair share

output:
  The report goes to stdout; without --out, its files go to a new folder out/replay/<date>-<time> each run.
  An --out folder that already holds a report is refused unless --overwrite is given. On a terminal, stderr
  shows a progress bar with the time left (--quiet: nothing on stderr but errors and warnings).

exit status: 0 every task of an accepted job ended exactly once; 1 some task did not; 2 bad usage or input;
  3 most tasks failed or most jobs were rejected (a WARNING on stderr names the reasons)
"""
CTL_COMMANDS = ("job", "queues", "nodes", "top", "reproduce")  # megha/ctl/: deployments; the papers' figures
TOKEN_COMMANDS = ("job", "queues", "nodes", "top")  # those that call the GMs with the user's API token
LOCAL_EPILOG = """\
output:
  The report goes to stdout (its times are wall-clock times); without --out, its files and the services' logs go
  to a new folder out/local/<date>-<time> each run. An --out folder that already holds a report is refused unless
  --overwrite is given. On a terminal, stderr shows a progress bar (tasks ended of tasks accepted) with the time
  left (--quiet: nothing on stderr but errors and warnings).

exit status: 0 every task of an accepted job ended exactly once and every LM is back to full capacity; 1 not so,
  or the replay timed out; 2 bad usage or input; 3 most tasks failed or most jobs were rejected (a WARNING on
  stderr names the reasons); 130 interrupted (every service was stopped)
"""


WORKLOAD = "workload"
DATA_CENTRE = "data centre"
SCHEDULER = "scheduler"
FAIRNESS = "fair scheduling (off unless --queues is given)"
FAILURES = "failures (simulated on the virtual clock; off unless --fail is given)"
RETRIES = "failed runs and retry rules (off unless --fail-fraction or --retry is given; docs/retry.md)"
DEPLOYMENT = "deployment"
SERVICES = "services"
OUTPUT = "output"


REPLAY = replace(ReplayConfig(), lm_order="rarity", matching="rarity")
"""`megha replay`'s defaults: the replay's own, but for placement the `rarity` LM order and node choice, which had
the lowest p99 JRT delay of every policy on all seven workloads measured (docs/lm-order.md, "Verdict").
`ReplayConfig` itself, which the experiments, `megha reproduce` and the embedded mode build on, keeps the fair
paper's round-robin order and random choice; so do the GM service's `MEGHA_LM_ORDER` and `MEGHA_MATCHING`."""


class NamedPath(click.Path):
    """A path option that names something: an empty value is refused (as a Path it would be the current folder)."""

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> object:
        if value == "":
            self.fail("is empty: name a folder", param, ctx)
        return super().convert(value, param, ctx)


def _verbatim(text: str) -> str:
    """`text` shown as written in --help (click rewraps paragraphs not marked with \\b)."""
    return "\n\n".join(f"\b\n{paragraph}" for paragraph in text.strip("\n").split("\n\n"))


def _workload(trace: str, first_jobs: int | None, time_scale: float, mode: str, time_help: str = "") -> Decorator:
    """The workload options of `replay` and `local` (the load generator's settings), with each command's defaults."""
    return options(
        setting("LoadgenSettings", "trace", default=trace, group=WORKLOAD),
        setting("LoadgenSettings", "first_jobs", default=first_jobs, group=WORKLOAD),
        setting("LoadgenSettings", "time_scale", default=time_scale, group=WORKLOAD, help=time_help or None),
        setting("LoadgenSettings", "mode", default=mode, group=WORKLOAD),
    )


def _size(what: str, default: int, help: str) -> Decorator:
    return option(f"--{what}", type=positive(int), default=default, help=help, group=DATA_CENTRE)


def _policy(flag: str, names: Iterable[str], help: str) -> Decorator:
    """A scheduler option naming one of `names` (sorted in its usage), `megha replay`'s default as its default."""
    return option(
        flag, type=OneOf(sorted(names)), default=getattr(REPLAY, flag[2:].replace("-", "_")), group=SCHEDULER, help=help
    )


def _node(default_cpu: int, default_mem: int) -> Decorator:
    """Each node's capacity (a worker agent's settings)."""
    return options(
        setting(
            "WorkerSettings",
            "node_cpu_millicores",
            "--node-cpu",
            dest="node_cpu",
            default=default_cpu,
            group=DATA_CENTRE,
        ),
        setting(
            "WorkerSettings", "node_memory_mb", "--node-mem", dest="node_mem", default=default_mem, group=DATA_CENTRE
        ),
    )


def _fairness(queues_help: str = "") -> Decorator:
    """Fair scheduling, as every GM, LM and the load generator read it (FairSettings)."""
    return options(
        setting("LoadgenSettings", "queues", check=parse_queues, group=FAIRNESS, help=queues_help or None),
        setting("LoadgenSettings", "share_policy", group=FAIRNESS),
    )


def _output(folder: Path, files: str) -> Decorator:
    """Where the report goes, and what stderr shows."""
    return options(
        option(
            "--out",
            type=NamedPath(path_type=Path),
            default=None,
            group=OUTPUT,
            help=f"folder for {files} (default: a new folder {folder}/<date>-<time>); one that already holds a "
            "report is refused unless --overwrite",
        ),
        option("--overwrite", is_flag=True, group=OUTPUT, help="replace the report already in the --out folder"),
        option(
            "--quiet", is_flag=True, group=OUTPUT, help="nothing on stderr but errors and warnings (no progress bar)"
        ),
    )


class _Megha(click.Group):
    """`megha`: the commands of this module, and those of megha/ctl/, imported when they are used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *CTL_COMMANDS])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in CTL_COMMANDS:
            from megha.ctl import cli as ctl

            return ctl.commands[name]
        return super().get_command(ctx, name)


@click.group(cls=_Megha, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.version_option(package_name="megha", prog_name="megha", message="%(prog)s %(version)s")
def megha() -> None:
    """Megha: a federated scheduler for data centres."""


@megha.command(
    cls=GroupedCommand,
    short_help="replay a trace through GMs, LMs and workers in one process (no broker, no network)",
    epilog=_verbatim(REPLAY_EXAMPLES),
)
@_workload(REPLAY.trace, REPLAY.first_jobs, REPLAY.time_scale, REPLAY.mode)
@setting("LoadgenSettings", "cpu_scale", default=REPLAY.cpu_scale, group=WORKLOAD)
@setting("LoadgenSettings", "mem_scale", default=REPLAY.mem_scale, group=WORKLOAD)
@option(
    "--truncate-durations",
    is_flag=True,
    group=WORKLOAD,
    help="truncate each task's duration in the trace to whole seconds (a task under 1 s lasts 0), as the "
    "constraint-aware paper's simulator reads a trace; default: as the trace gives them",
)
@option(
    "--dephase-arrivals",
    is_flag=True,
    group=WORKLOAD,
    help="move the k-th job that arrives at the same time as an earlier one k x 0.01 s later, as the "
    "constraint-aware paper's simulator reads a trace; default: as the trace gives them",
)
@option("--users", type=positive(int), default=REPLAY.users, group=WORKLOAD, help="users jobs are spread over")
@option(
    "--no-constraints",
    is_flag=True,
    group=WORKLOAD,
    help="give tasks no placement constraints (small data centres reject many constrained jobs)",
)
@option(
    "--cluster",
    default=REPLAY.cluster,
    group=DATA_CENTRE,
    help="'generate', 'reference' (../shared's published 10,000-node cluster) or a cluster JSON file",
)
@_size("lms", REPLAY.lms, "LMs when generating")
@_size("gms", REPLAY.gms, "GMs when generating")
@_size("workers-per-partition", REPLAY.workers_per_partition, "workers in each LM partition when generating")
@option(
    "--machine-constraints",
    type=OneOf(sorted(MACHINE_DRAWS)),
    default=REPLAY.machine_constraints,
    group=DATA_CENTRE,
    help="when generating: per-node (each node drawn with the published fractions) or per-lm (each LM one machine "
    "class, so constrained nodes are concentrated in some LMs)",
)
@_node(REPLAY.node_cpu_millicores, REPLAY.node_memory_mb)
@option(
    "--scheduler",
    type=OneOf(sorted(SCHEDULERS)),
    default=REPLAY.scheduler,
    group=SCHEDULER,
    help="Megha, or a baseline to compare with: centralized (one GM, one LM), pigeonc (distributors and masters of "
    "fixed groups), pigeonc-published (PigeonC with the authors' simulator's worker count, which reproduces the "
    "published figures), sparrow (batch sampling, late binding); a baseline refuses Megha's GM policies and "
    "--delta-interval, and sparrow --matching",
)
@option(
    "--pigeonc-masters",
    type=positive(int),
    default=REPLAY.pigeonc_masters,
    group=SCHEDULER,
    help="with --scheduler pigeonc or pigeonc-published: PigeonC's masters, each a contiguous group of the nodes "
    "(the paper's 100: 100 workers each on 10,000)",
)
@setting("GMSettings", "matching", default=REPLAY.matching, group=SCHEDULER)
@setting("GMSettings", "lm_order", default=REPLAY.lm_order, group=SCHEDULER)
@setting("GMSettings", "queue_order", default=REPLAY.queue_order, group=SCHEDULER)
@setting("GMSettings", "unplaceable", default=REPLAY.unplaceable, group=SCHEDULER)
@setting(
    "GMSettings",
    "priority_classes",
    default=REPLAY.priority_classes,
    group=SCHEDULER,
    check=parse_priority_classes,
    help="priority classes as name:value,... e.g. low:0,normal:100,high:1000 (a higher value is served first and "
    "preempts lower ones under contention; docs/priority.md); empty: off unless --job-classes is given (then "
    "these defaults)",
)
@option(
    "--job-classes",
    default=REPLAY.job_classes,
    group=SCHEDULER,
    help="each job's priority class, drawn per job with the seed, as class:fraction,... e.g. low:50%,high:25% "
    "(the rest of the jobs, here 25%, in the default class normal)",
)
@_policy(
    "--unsatisfiable",
    UNSATISFIABLE,
    "a task no node could ever run: reject its job at submission, or drop the task (it fails with the reason, "
    "the job's other tasks run; the authors' simulator)",
)
@_policy(
    "--inconsistent",
    INCONSISTENT,
    "a task an LM refused as inconsistent (its GM's view was stale): retry it at once on the states the LM "
    "answered with, or let it wait until a node it could use frees up in the view (the authors' simulator)",
)
@_policy(
    "--waiting-order",
    WAITING_ORDERS,
    "which of the tasks waiting for a freed node (parked, and refused ones that wait) gets a node that frees "
    "up: by shape, each shape in the order it was first parked, or arrival: one queue as the authors' simulator, "
    "refused tasks first (the newest first), then the rest in the order they were queued, the first that fits "
    "(with the fifo queue order only)",
)
@_policy(
    "--answer-states",
    ANSWER_STATES,
    "whether an LM's answer to a launch batch carries the state of the nodes it touched and the GM's pending "
    "delta: always, or only when it refuses a placement (the authors' simulator: a GM then learns of nodes other "
    "GMs' tasks freed from heartbeats and refusals only)",
)
@option(
    "--delta-states",
    type=OneOf(list(DELTA_STATES)),
    default=REPLAY.delta_states,
    group=SCHEDULER,
    help="what an LM's delta reports of a node that changed more than once since the GM's last: its latest state, "
    "or free if it was freed at any time since (the authors' simulator, whose updates list taken and freed nodes "
    "and apply the freed ones last)",
)
@option(
    "--dependencies",
    default=REPLAY.dependencies or "none",
    group=SCHEDULER,
    help="job dependencies: chain:K makes each job depend on the job K before it in the trace (chain:K:F only a "
    "fraction F of the jobs); a job waits until its parent finished and fails if it failed (docs/dependencies.md)",
)
@option(
    "--gangs",
    type=Bounded(float, ge=0, le=1),
    default=REPLAY.gangs,
    group=SCHEDULER,
    help="fraction of jobs (drawn with --seed) that are gangs: every task of the job starts or none does "
    "(docs/gang.md)",
)
@setting("GMSettings", "gang_reserve_after", default=REPLAY.gang_reserve_after, group=SCHEDULER)
@option(
    "--queueable",
    type=Bounded(float, ge=0, le=1),
    default=REPLAY.queueable,
    group=SCHEDULER,
    help="the fraction of tasks made queueable (chosen with the seed): they wait in a node's queue beyond its free "
    "resources and guaranteed tasks evict them (docs/queueable.md)",
)
@option(
    "--hop-delay",
    type=Bounded(float, ge=0, le=MAX_SECONDS),
    default=REPLAY.hop_delay,
    group=SCHEDULER,
    help="network delay per message hop, seconds",
)
@option(
    "--event-order",
    type=OneOf(list(EVENT_ORDERS)),
    default=REPLAY.event_order,
    group=SCHEDULER,
    help="the order of events due at the same virtual time: fifo (the order they were sent) or seeded (a random "
    "order drawn with --seed, even between the same two endpoints; the authors' simulator leaves it undefined)",
)
@setting("LMSettings", "delta_interval", default=REPLAY.delta_interval, group=SCHEDULER)
@option(
    "--delta-offset",
    type=Bounded(float, ge=0),
    default=REPLAY.delta_offset,
    group=SCHEDULER,
    help="seconds past each multiple of --delta-interval at which the LMs send their deltas (less than the "
    "interval). A replay moves the trace's first job to time 0; the constraint-aware paper's simulator sends its "
    "heartbeats 0.05 s before that job and every interval after: --delta-interval minus 0.05",
)
@setting("GMSettings", "seed", default=REPLAY.seed, group=SCHEDULER, help="seed for cluster, constraints and choices")
@option(
    "--seeds",
    type=positive(int),
    default=1,
    group=SCHEDULER,
    help="replay with N seeds (--seed, --seed + 1, ...), report each and the mean and min - max of the JRT delay "
    "p50 and p99 and the allocation time p99",
)
@option(
    "--decision-costs",
    type=OneOf(sorted(PRESETS)),
    default=REPLAY.decision_costs,
    group=SCHEDULER,
    help="time GMs and LMs take to handle a message: zero, or calibrated from this code's cores (each GM and LM "
    "then queues what it cannot handle yet; docs/decision-time.md)",
)
@option(
    "--realtime",
    is_flag=True,
    group=SCHEDULER,
    help="run on the wall clock instead of the virtual clock: each event waits for its time, and the report's times "
    "are wall-clock times",
)
@_fairness(
    "user queues as user:share:gm,... e.g. q1:10%:0,q2:25%:1,q3:15%:1,q4:50%:2; jobs go to the queues round-robin; "
    "a user below its share preempts users above theirs under contention"
)
@option(
    "--fail",
    multiple=True,
    metavar="SPEC",
    group=FAILURES,
    help="worker:rate=R crashes worker nodes at random, R per node per hour (at most 3600); "
    "worker:at=T,lm=L,node=N[,down=D] "
    "crashes one at time T; lm:rate=R, lm:at=T,lm=L[,down=D], gm:rate=R and gm:at=T,gm=G[,down=D] crash LMs and "
    "GMs (they restart D seconds later, default --fail-repair); partition:at=T,lm=L[,down=D] and "
    "partition:at=T,gm=G[,down=D] hold the messages to and from one for D seconds (repeatable)",
)
@setting(
    "LMSettings",
    "worker_timeout",
    "--fail-detect",
    dest="fail_detect",
    group=FAILURES,
    help="seconds until an LM notices a crashed worker (MEGHA_WORKER_TIMEOUT)",
)
@option(
    "--fail-repair",
    type=positive(float),
    default=60.0,
    group=FAILURES,
    help="seconds after a crash until the node is back in service, or the LM or GM restarts",
)
@setting("GMSettings", "max_attempts", default=REPLAY.max_attempts, group=FAILURES)
@option(
    "--fail-fraction",
    type=Bounded(float, ge=0, le=1),
    default=REPLAY.fail_fraction,
    group=RETRIES,
    help="fraction of simulated runs that fail (each drawn with the seed), at the end of their duration",
)
@option(
    "--fail-exit-code",
    type=click.IntRange(1, 255),
    default=REPLAY.fail_exit_code,
    group=RETRIES,
    help="the exit code failed runs report",
)
@option(
    "--retry",
    "retry_rule",
    metavar="ATTEMPTS:BACKOFF[:CODES]",
    default=REPLAY.retry,
    callback=lambda _ctx, _param, value: _retry_rule(value),
    group=RETRIES,
    help="every trace job's retry rule: a task's run that fails with one of CODES (comma-separated; none: any "
    "non-zero exit code) runs again after BACKOFF s, doubling per retry, times a seeded jitter in [0.5, 1.5); at "
    "most ATTEMPTS runs may fail (e.g. 3:10, 4:1:1,137)",
)
@_output(REPLAY_OUT, "tasks.csv, jobs.csv, summary.json, utilization.csv, cdf.png")
@option("--no-files", is_flag=True, group=OUTPUT, help="print the report only")
def replay(**args: Any) -> int:
    """Replay a job trace through the embedded Megha system (GMs, LMs and simulated workers joined by an
    in-memory transport on a virtual clock) and report allocation time, JRT delay and utilization."""
    return _replay(SimpleNamespace(**args))


@megha.command(
    cls=GroupedCommand,
    short_help="start GMs, LMs and worker agents as local processes, replay a trace through them, report, stop",
    epilog=_verbatim(LOCAL_EPILOG),
)
@_size("gms", 2, "GMs")
@_size("lms", 2, "LMs")
@_size("workers-per-lm", 2, "worker agents per LM")
@setting(
    "WorkerSettings",
    "nodes",
    "--nodes-per-worker",
    dest="nodes_per_worker",
    group=DATA_CENTRE,
    help="nodes each agent stands for; more than 1 needs --execution simulated",
)
@setting("WorkerSettings", "execution", group=DATA_CENTRE)
@_node(2000, 4096)
@setting(
    "WorkerSettings",
    "constraint_seed",
    group=DATA_CENTRE,
    help="draw node constraints with the published fractions (default: nodes satisfy all)",
)
@_workload("demo", 20, 0.0002, "scaled", "multiply arrivals and durations; the demo's tasks last hours")
@setting("LoadgenSettings", "cpu_scale", group=WORKLOAD)
@setting(
    "LoadgenSettings",
    "mem_scale",
    default=1000,
    group=WORKLOAD,
    help="scaled mode memory divisor; 1000 keeps a laptop's memory safe",
)
@setting("LoadgenSettings", "seed", group=WORKLOAD)
@_fairness()
@setting("LMSettings", "delta_interval", group=SERVICES)
@setting("WorkerSettings", "heartbeat_interval", group=SERVICES)
@setting("LMSettings", "worker_timeout", group=SERVICES)
@setting(
    "LoadgenSettings",
    "amqp_url",
    group=SERVICES,
    help="RabbitMQ connection URL (amqps:// for TLS, verified with MEGHA_TLS_CA). Without it a run of real tasks "
    "starts a RabbitMQ node of its own with a user per role and no guest (as its tasks run on this machine, where "
    "RabbitMQ lets its guest administrator in: docs/security.md), and --execution simulated uses this default",
)
@setting(
    "LoadgenSettings",
    "run_id",
    default=None,
    group=SERVICES,
    help="prefix of this deployment's queues (default: random)",
)
@_output(LOCAL_OUT, "the report files and service logs")
def local(**args: Any) -> int:
    """Start a whole deployment on this host (separate processes, real RabbitMQ), replay a trace through the GMs'
    REST API, print the report, and shut everything down (also on Ctrl-C)."""
    return _local(SimpleNamespace(**args))


class _ServiceCommand(click.Command):
    """A service's command, whose --help ends with every MEGHA_* variable of its settings model (`model`, a class of
    megha.common.settings by name), read from the model (importing pydantic) only when the help is shown."""

    def __init__(self, *args: Any, model: str, **kwargs: Any) -> None:
        self.model = model
        super().__init__(*args, **kwargs)

    @property  # type: ignore[override]
    def epilog(self) -> str:
        from megha.common import settings

        return _verbatim(settings.settings_help(getattr(settings, self.model)))

    @epilog.setter
    def epilog(self, value: str | None) -> None:
        """Ignored (click.Command sets it): the epilog is the model's variables."""


def _service(name: str, what: str, model: str) -> None:
    """`megha gm|lm|worker|loadgen`: a service, configured by MEGHA_* variables (those of the settings model
    `model`), which its --help lists."""

    @megha.command(
        name,
        cls=_ServiceCommand,
        model=model,
        short_help=f"run {what}, configured by MEGHA_* environment variables (see docs/deploy.md)",
        help=f"Run {what}, configured by MEGHA_* environment variables (docs/deploy.md).",
    )
    def serve() -> int:
        if name == "loadgen":
            from megha.loadgen.services import main as loadgen_main

            return loadgen_main(f"megha {name}")
        from megha.services import run

        getattr(run, f"serve_{name}")(f"megha {name}")
        return 0


_service("gm", "a Global Master", "GMSettings")
_service("lm", "a Local Master", "LMSettings")
_service("worker", "a worker agent", "WorkerSettings")
_service("loadgen", "the request generator against running GMs", "LoadgenSettings")


@megha.command(
    short_help="the chaos matrix: kill, stall or cut off each component mid-replay and count what was lost "
    "(megha chaos --help)",
    add_help_option=False,
    context_settings={"ignore_unknown_options": True, "help_option_names": []},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def chaos(args: tuple[str, ...]) -> int:
    from megha.deploy.chaos import main as chaos_main

    return chaos_main(list(args))


@megha.command(
    short_help="issue a GM's, LM's or agent's own credential (MEGHA_CREDENTIAL) from the cluster secret",
    epilog="Example: MEGHA_CLUSTER_SECRET_FILE=secrets/cluster-secret megha credential worker rack7-a > "
    "worker-rack7-a.credential (then MEGHA_CREDENTIAL_FILE=worker-rack7-a.credential on that agent only).",
)
@click.argument("role", type=click.Choice(["gm", "lm", "worker"]))
@click.argument("ident")
def credential(role: str, ident: str) -> int:
    """Print the credential of service ROLE IDENT (IDENT: the GM's or LM's number, the agent's MEGHA_WORKER_ID),
    issued from the deployment's cluster secret (MEGHA_CLUSTER_SECRET or MEGHA_CLUSTER_SECRET_FILE). The service
    signs its calls with it and can sign as itself only; keep the cluster secret where no service runs
    (docs/security.md)."""
    from megha.common.auth import Credential
    from megha.common.settings import ServiceSettings, load_settings

    if role in ("gm", "lm") and not (ident.isascii() and ident.isdigit() and str(int(ident)) == ident):
        raise click.BadParameter(
            f"{'an' if role == 'lm' else 'a'} {role.upper()}'s id is its number (0, 1, ...; "
            f"MEGHA_{role.upper()}_ID), got {ident!r}",
            param_hint="IDENT",
        )
    secret = load_settings(ServiceSettings, "megha credential").cluster_secret.get_secret_value()
    if not secret:
        raise click.UsageError("MEGHA_CLUSTER_SECRET (or MEGHA_CLUSTER_SECRET_FILE) is not set")
    try:
        click.echo(Credential.issue(secret, role, ident).encode())  # type: ignore[arg-type]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="IDENT") from None
    return 0


def check_input_file(value: str, option: str) -> None:
    """A file a command will read, refused up front in one usage line naming `option` when it is a directory, not
    a regular file (a FIFO would block the read for ever) or cannot be opened. A missing file is left to the
    reader, which says what it expected there."""
    path = Path(value)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise click.BadParameter(f"cannot read {value}: {exc.strerror}", param_hint=option) from None
    if stat.S_ISDIR(mode):
        raise click.BadParameter(f"{value} is a directory, not a file", param_hint=option)
    if not stat.S_ISREG(mode):
        raise click.BadParameter(f"{value} is not a regular file", param_hint=option)
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise click.BadParameter(f"cannot read {value}: {exc.strerror}", param_hint=option) from None


def check_out_folder(out: Path | None, option: str = "--out", default: Path | None = None) -> None:
    """An --out folder refused up front in one usage line when it, or a folder above it, is an existing file, or
    when it cannot be made or a file cannot be written in it: the folders missing are made and a file is written
    in the last, then all are removed again (the run makes them when it writes its report), so that a run
    refused for another reason leaves no empty folder behind. Without `out`, the `default` folder the report's
    own folder is made in is checked so."""
    named = out
    if out is None:
        if default is None:
            return
        out = default
    missing = []
    try:
        for folder in (out, *out.parents):
            if folder.exists():
                if not folder.is_dir():
                    what = "is a file, not a folder" if folder == out else f"cannot be made: {folder} is a file"
                    raise click.BadParameter(f"{_out_name(out, named)} {what}", param_hint=option)
                break
            if folder.is_symlink():
                what = "is" if folder == out else f"cannot be made: {folder} is"
                where = f"{_out_name(out, named)} {what} a link to {os.readlink(folder)}, which does not exist"
                raise click.BadParameter(where, param_hint=option)
            missing.append(folder)
    except OSError as exc:  # a name too long, a folder above it that may not be looked in
        message = f"{_out_name(out, named)} cannot be made: {exc.strerror or exc}"
        raise click.BadParameter(message, param_hint=option) from None
    if named is None:
        return  # the run's own folder is made in it, and probed, by `_report_folder`
    made: list[Path] = []
    try:
        for folder in reversed(missing):
            folder.mkdir()
            made.append(folder)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        what = "cannot be made" if made != missing else "cannot be written to"
        raise click.BadParameter(f"{_out_name(out, named)} {what}: {exc.strerror or exc}", param_hint=option) from None
    finally:
        for folder in reversed(made):
            folder.rmdir()


def _report_folder(out: Path | None, default: Path, overwrite: bool) -> Path:
    """The folder of a run's report (`report.report_dir`): without `out`, a new one of the run's own under `default`,
    made now and probed (runs started together never share one, and none removes another's folder)."""
    from megha.loadgen.report import forget_report_dir, report_dir

    if out is not None:
        return report_dir(out, default, overwrite)
    folder = None
    try:
        folder = report_dir(None, default, overwrite)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        forget_report_dir(folder)
        what = "cannot be made" if folder is None else "cannot be written to"
        raise click.BadParameter(
            f"{_out_name(default, None)} {what}: {exc.strerror or exc}", param_hint="--out"
        ) from None
    return folder


def _out_name(out: Path, named: Path | None) -> str:
    return str(out) if named is not None else f"{out}, the report folder when --out is not given,"


def _warn(command: str, warnings: list[str]) -> None:
    for warning in warnings:
        print(f"megha {command}: WARNING: {warning}", file=sys.stderr)


def _local(args: SimpleNamespace) -> int:
    from megha.loadgen.report import forget_report_dir

    _check_local(args)
    out = _report_folder(args.out, LOCAL_OUT, args.overwrite)
    try:
        return _local_into(args, out)
    except BaseException:
        forget_report_dir(out)  # the folder made for this run's report, when nothing was written in it
        raise


def _local_into(args: SimpleNamespace, out: Path) -> int:
    """`_local`'s deployment and run, its report and service logs in `out`."""
    from megha.common.settings import LoadgenSettings
    from megha.deploy.local import BrokerUnreachable, LocalDeployment, guest_risk, run_local
    from megha.loadgen.progress import Progress
    from megha.loadgen.report import format_table, run_warnings, write_outputs

    # Real tasks run on this machine, where RabbitMQ lets guest in: unless told a broker, a node of the run's own.
    named_broker = click.get_current_context().get_parameter_source("amqp_url") not in (
        None,
        click.core.ParameterSource.DEFAULT,
    )
    own_broker = args.execution == "real" and not named_broker
    if args.execution == "real" and named_broker and (risk := guest_risk(args.amqp_url)):
        print(f"megha local: WARNING: this run uses the broker at its --amqp-url{risk}", file=sys.stderr)
    deployment = LocalDeployment(
        gms=args.gms,
        lms=args.lms,
        workers_per_lm=args.workers_per_lm,
        nodes_per_worker=args.nodes_per_worker,
        execution=args.execution,
        node_cpu_millicores=args.node_cpu,
        node_memory_mb=args.node_mem,
        constraint_seed=args.constraint_seed,
        queues=args.queues,
        share_policy=args.share_policy,
        delta_interval=args.delta_interval,
        heartbeat_interval=args.heartbeat_interval,
        worker_timeout=args.worker_timeout,
        amqp_url=args.amqp_url,
        own_broker=own_broker,
        log_dir=out / "logs",
        **({"run_id": args.run_id} if args.run_id else {}),
    )
    settings = LoadgenSettings(
        trace=args.trace,
        first_jobs=args.first_jobs,
        time_scale=args.time_scale,
        mode=args.mode,
        cpu_scale=args.cpu_scale,
        mem_scale=args.mem_scale,
        seed=args.seed,
        out=str(out),
        auth="on" if deployment.auth else "off",  # the deployment made the secrets and the operator's token
        api_token=deployment.operator_token,
    )
    try:
        run, states = run_local(deployment, settings, None if args.quiet else Progress())
    except BrokerUnreachable as exc:
        raise click.BadParameter(str(exc), param_hint="--amqp-url") from None
    except KeyboardInterrupt:
        print("interrupted: every service was stopped", file=sys.stderr)
        return 130
    assert run.metrics is not None
    title = f"Megha local deployment ({args.gms} GMs, {args.lms} LMs, {args.workers_per_lm} agents per LM)"
    print(format_table(run.metrics, title))
    for state in states:
        print(
            f"LM {state['lm']}: {state['launched']} launched, {state['inconsistencies']} inconsistencies, "
            f"{state['repartitions']} repartitions, back to full capacity: {state['idle']}"
        )
    paths = write_outputs(
        run.metrics,
        run.tasks,
        list(run.jobs.values()),
        out,
        title,
        {"args": {k: str(v) for k, v in vars(args).items()}},
    )
    print(f"wrote {', '.join(str(p) for p in paths.values())}; service logs in {out / 'logs'}")
    warnings = run_warnings(run.metrics, files=True)
    _warn("local", warnings)
    if run.metrics.not_exactly_once or run.timed_out or not all(s["idle"] for s in states):
        return 1
    return 3 if warnings else 0


def _check_local(args: SimpleNamespace) -> None:
    """`megha local`'s inputs, checked before any service starts (each would otherwise fail, or wait a minute for
    the broker, with a traceback in its log): one usage line naming the option."""
    from megha.common.memory_budget import SERVICE_PROCESS_BYTES, check_fits
    from megha.loadgen.services import check_submittable
    from megha.loadgen.trace import TraceError, demo_trace_path, resolve_trace

    check_out_folder(args.out, default=LOCAL_OUT)
    processes = args.gms + args.lms * (1 + args.workers_per_lm)
    check_fits(
        processes * SERVICE_PROCESS_BYTES,
        f"--gms {args.gms}, --lms {args.lms} and --workers-per-lm {args.workers_per_lm} ({processes:,} service "
        "processes)",
        "start fewer",
    )
    if args.nodes_per_worker > 1 and args.execution != "simulated":
        raise click.UsageError(
            f"--nodes-per-worker {args.nodes_per_worker} needs --execution simulated (an agent that runs its tasks "
            "for real is one node)"
        )
    if args.queues:
        try:
            parse_queues(args.queues).check_gms(args.gms)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--queues") from None
    if args.trace != "demo" and not args.trace.startswith("syn:"):
        check_input_file(args.trace, "--trace")
    trace = str(demo_trace_path()) if args.trace == "demo" else args.trace
    try:
        check_submittable(resolve_trace(trace, args.first_jobs, args.time_scale), args.trace)
    except TraceError as exc:
        raise click.BadParameter(str(exc), param_hint="--trace") from None


def _retry_rule(value: str) -> str:
    """`--retry` checked as it is read (a bad rule is a usage error naming the option)."""
    from megha.common.core.retry import parse_rule

    if value:
        try:
            parse_rule(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--retry") from None
    return value


def _placement_default(args: SimpleNamespace, name: str) -> str:
    """`args`' `matching` or `lm_order`. For a baseline scheduler (not Megha or centralized) that the command line
    did not name, the policy it runs as its paper has it (`ReplayConfig`'s: random choice, and the LM order it does
    not use), not `megha replay`'s own `rarity` default."""
    value: str = getattr(args, name)
    if args.scheduler not in ("megha", "centralized"):
        source = click.get_current_context().get_parameter_source(name)
        if source in (None, click.core.ParameterSource.DEFAULT):
            return str(getattr(ReplayConfig(), name))
    return value


UNUSED_BY = {
    "matching": ("sparrow",),
    "pigeonc_masters": ("megha", "centralized", "sparrow"),
    "delta_interval": ("pigeonc", "pigeonc-published", "sparrow"),
    "delta_offset": ("pigeonc", "pigeonc-published", "sparrow"),
}
"""`megha replay` options a baseline scheduler has no use for: Sparrow's probes pick the workers (no matching), and
neither baseline has LM deltas; only PigeonC has masters. Named on the command line with such a scheduler, they are
refused, not ignored."""


def _generated(args: SimpleNamespace) -> bool:
    return bool(args.cluster == "generate")


NEEDS: dict[str, tuple[Callable[[SimpleNamespace], bool], str]] = {
    "lms": (_generated, "sizes a generated data centre (--cluster generate); a cluster file has its own LMs"),
    "gms": (_generated, "sizes a generated data centre (--cluster generate); a cluster file has its own GMs"),
    "workers_per_partition": (_generated, "sizes a generated data centre (--cluster generate), not a cluster file"),
    "out": (lambda args: not args.no_files, "names the report's folder, and --no-files writes none"),
    "overwrite": (lambda args: not args.no_files, "replaces a report, and --no-files writes none"),
    "gang_reserve_after": (lambda args: args.gangs > 0, "is for gangs: give --gangs too"),
    "share_policy": (lambda args: bool(args.queues), "divides the --queues' shares: give --queues too"),
    "fail_detect": (lambda args: bool(args.fail), "is for workers crashed by --fail: give --fail too"),
    "fail_repair": (lambda args: bool(args.fail), "is for crashes by --fail: give --fail too"),
}
"""`megha replay` options that do something only with another: named on the command line without it, refused (as
those of `UNUSED_BY`), not ignored in silence."""


def _refuse_unused(args: SimpleNamespace) -> None:
    """A usage error for an option of `UNUSED_BY` that the command line names with a scheduler it plays no part in."""
    context = click.get_current_context()
    for name, schedulers in UNUSED_BY.items():
        if args.scheduler in schedulers and context.get_parameter_source(name) not in (
            None,
            click.core.ParameterSource.DEFAULT,
        ):
            option = "--" + name.replace("_", "-")
            raise click.UsageError(f"{option} plays no part in --scheduler {args.scheduler}: leave it out")


def _refuse_unneeded(args: SimpleNamespace) -> None:
    """A usage error for an option of `NEEDS` that the command line names without what it needs."""
    context = click.get_current_context()
    for name, (needed, why) in NEEDS.items():
        if context.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE and not needed(args):
            raise click.UsageError(f"--{name.replace('_', '-')} {why}")


def _replay(args: SimpleNamespace) -> int:
    """`megha replay`: one replay per seed (`--seeds`), each reported as a single replay is; with several, their
    headline figures side by side, and the worst exit status."""
    _refuse_unused(args)
    from megha.loadgen.report import forget_report_dir

    if not args.no_files:
        check_out_folder(args.out, default=REPLAY_OUT)
    if args.trace != "demo" and not args.trace.startswith("syn:"):
        check_input_file(args.trace, "--trace")
    if args.cluster not in ("generate", "reference"):
        check_input_file(args.cluster, "--cluster")
    _refuse_unneeded(args)  # after the files named: a cluster file that cannot be read is the first thing to say
    out = None if args.no_files else _report_folder(args.out, REPLAY_OUT, args.overwrite)
    try:
        return _replay_into(args, out)
    except BaseException:
        forget_report_dir(out)  # the folder made for this run's report, when it ended before writing it
        raise


def _replay_into(args: SimpleNamespace, out: Path | None) -> int:
    """`_replay`'s runs, their reports in `out` (None: --no-files)."""
    from megha.loadgen.figure_process import FigureProcess
    from megha.loadgen.report import report_dir
    from megha.loadgen.seeds import SeedFigures
    from megha.loadgen.trace import demo_trace_path

    seeds = range(args.seed, args.seed + args.seeds)
    # Several seeds: each seed's report in a folder of its own, checked before anything runs.
    outs = {
        seed: out if out is None or len(seeds) == 1 else report_dir(out / f"seed-{seed}", REPLAY_OUT, args.overwrite)
        for seed in seeds
    }
    if out is not None and args.overwrite:
        _remove_old_report(out, single=len(seeds) == 1)
    config = ReplayConfig(
        trace=str(demo_trace_path()) if args.trace == "demo" else args.trace,
        first_jobs=args.first_jobs,
        time_scale=args.time_scale,
        truncate_durations=args.truncate_durations,
        dephase_arrivals=args.dephase_arrivals,
        cluster=args.cluster,
        lms=args.lms,
        gms=args.gms,
        workers_per_partition=args.workers_per_partition,
        node_cpu_millicores=args.node_cpu,
        node_memory_mb=args.node_mem,
        mode=args.mode,
        cpu_scale=args.cpu_scale,
        mem_scale=args.mem_scale,
        matching=_placement_default(args, "matching"),
        lm_order=_placement_default(args, "lm_order"),
        queue_order=args.queue_order,
        unplaceable=args.unplaceable,
        unsatisfiable=args.unsatisfiable,
        inconsistent=args.inconsistent,
        waiting_order=args.waiting_order,
        answer_states=args.answer_states,
        delta_states=args.delta_states,
        dependencies="" if args.dependencies == "none" else args.dependencies,
        machine_constraints=args.machine_constraints,
        scheduler=args.scheduler,
        pigeonc_masters=args.pigeonc_masters,
        hop_delay=args.hop_delay,
        event_order=args.event_order,
        delta_interval=args.delta_interval,
        delta_offset=args.delta_offset,
        seed=args.seed,
        users=args.users,
        realtime=args.realtime,
        queues=args.queues,
        constraints=not args.no_constraints,
        share_policy=args.share_policy,
        max_attempts=args.max_attempts,
        decision_costs=args.decision_costs,
        fail_fraction=args.fail_fraction,
        fail_exit_code=args.fail_exit_code,
        retry=args.retry_rule,
        priority_classes=args.priority_classes,
        job_classes=args.job_classes,
        gangs=args.gangs,
        gang_reserve_after=args.gang_reserve_after,
        queueable=args.queueable,
    )
    runs, statuses = [], []
    # cdf.png is drawn by a child process that imports matplotlib while the replays run (loadgen/figure_process.py).
    drawer = FigureProcess.start() if out is not None else None
    try:
        for seed in seeds:
            faults = parse_faults(args.fail, args.fail_detect, args.fail_repair, seed)
            seeded = replace(config, seed=seed, faults=faults)
            metrics, status = _replay_seed(seeded, args, outs[seed], len(seeds) > 1, drawer)
            runs.append((seed, metrics))
            statuses.append(status)
    finally:
        if drawer is not None:
            drawer.close()
    if len(seeds) > 1:
        figures = SeedFigures.of(runs)
        print(figures.table())
        if out is not None:
            path = out / SEEDS_FILE
            path.write_text(json.dumps(figures.document(), indent=2, allow_nan=False) + "\n")
            print(f"wrote {path}")
    return 1 if 1 in statuses else max(statuses)


SEEDS_FILE = "seeds.json"


def _remove_old_report(out: Path, single: bool) -> None:
    """With --overwrite, the report files of `out` that this run will not write again: a single replay's (with
    --seeds N, each seed's report goes to seed-<n>/), or the seeds' summary (a single replay writes none). Only
    the known report file names are removed."""
    from megha.loadgen.report import REPORT_FILES

    for name in (SEEDS_FILE,) if single else REPORT_FILES:
        path = out / name
        if path.is_file() or path.is_symlink():
            path.unlink()


def _replay_seed(
    config: ReplayConfig, args: SimpleNamespace, out: Path | None, named: bool, drawer: FigureProcess | None
) -> tuple[RunMetrics, int]:
    """One replay of `megha replay`, reported (its seed in the title when `named`, its figure drawn by `drawer`
    when given); its metrics and exit status."""
    from megha.loadgen.progress import Progress
    from megha.loadgen.replay import config_dict, replay
    from megha.loadgen.report import format_counters, format_table, run_warnings, write_outputs

    result = replay(config, None if args.quiet else Progress())
    order = f"{config.lm_order} LM order, " if config.scheduler in ("megha", "centralized") else ""
    order += "" if config.scheduler in UNUSED_BY["matching"] else f"{config.matching} matching, "
    title = f"{config.scheduler.capitalize()} replay of {args.trace} ({order}{config.mode} mode"
    title += f", {config.decision_costs} decision costs" if config.decision_costs != "zero" else ""
    title += f", seed {config.seed})" if named else ")"
    print(format_table(result.metrics, title))
    counters = result.system.counters()
    if counters:
        print(format_counters(config.scheduler, counters))
    if out is not None:
        extra = {
            "config": config_dict(config),
            "scheduler_counters": counters,
            "command": " ".join(["megha", *sys.argv[1:]]),
            "machine": {"python": platform.python_version(), "platform": platform.platform()},
        }
        paths = write_outputs(
            result.metrics,
            result.recorder.tasks,
            list(result.recorder.jobs.values()),
            out,
            title,
            extra,
            drawer,
        )
        print(f"wrote {', '.join(str(p) for p in paths.values())}")
    warnings = run_warnings(result.metrics, files=out is not None)
    _warn("replay", warnings)
    if result.metrics.not_exactly_once:
        return result.metrics, 1
    return result.metrics, 3 if warnings else 0


def main(argv: list[str] | None = None) -> int:
    """Run `megha <argv>`; its exit status. A usage error is one line on stderr and SystemExit(2); --help and
    --version exit with SystemExit(0) (as argparse did, so callers and tests see the same)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in TOKEN_COMMANDS:
        from megha.client import token_from_env

        try:
            token_from_env()  # the token given both ways, or a file that cannot be read: before anything runs
        except ValueError as exc:
            print(f"megha {argv[0]}: error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
    try:
        with megha.make_context("megha", argv) as ctx:
            return megha.invoke(ctx) or 0
    except click.exceptions.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()
        raise SystemExit(2) from None
    except click.UsageError as exc:
        if exc.ctx is not None:
            where = exc.ctx.command_path
        else:  # an error of the option parser, which knows no command
            where = f"megha {argv[0]}" if argv and argv[0] in megha.list_commands(click.Context(megha)) else "megha"
        print(f"{where}: error: {usage_line(exc)} (see {where} --help)", file=sys.stderr)
        raise SystemExit(2) from None
    except click.ClickException as exc:  # megha job|queues|nodes|top: a service refused or could not be reached
        exc.show()
        return exc.exit_code
    except (ValueError, FileNotFoundError) as exc:
        print(f"megha {argv[0]}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: what the command started is stopped on the way out (`finally` blocks)
        print(f"megha {argv[0]}: interrupted" if argv else "megha: interrupted", file=sys.stderr)
        return 130
    except (RecursionError, OverflowError, MemoryError) as exc:  # input too deep or too large for the code
        print(f"megha {argv[0]}: error: input too large or too deeply nested: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # whoever reads standard output stopped (`| head`): `exit_quietly_if_stdout_closed`
        raise
    except OSError as exc:  # a path of the command line that cannot be read or written
        where = f": {exc.filename}" if exc.filename else ""
        print(f"megha {argv[0]}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2


def script() -> NoReturn:
    """The `megha` command (the console script, and `python -m megha.cli`): `main` on the process's arguments,
    then exit with its status. A command builds a large heap, mostly acyclic and freed by reference counting
    (a replay's cores, workload and records), so the cyclic collector runs rarely meanwhile; at exit, the heap is
    left to the operating system instead of traced by one last collection (a quarter of a second after the
    syn_250 replay). atexit handlers still run and stdout and stderr are flushed; every file a command writes is
    closed once written. The heap is frozen before the collector's threshold returns to its default, which would
    otherwise start at once a collection of everything allocated since the last one (tens of milliseconds)."""

    def run() -> int:
        with fewer_gc_pauses():
            status = main()
            gc.freeze()
        return status

    exit_quietly_if_stdout_closed(run)


if __name__ == "__main__":
    script()
