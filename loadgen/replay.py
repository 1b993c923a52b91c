"""Trace replay in embedded mode: build the cluster and workload, run the system, and measure the run."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

from megha.common.clusterfile import generate_cluster, in_resource_order, load_cluster
from megha.common.core.cluster import ClusterSpec
from megha.common.core.costs import PRESETS, DecisionCosts
from megha.common.core.fairness.config import FairnessConfig, parse_queues
from megha.common.core.fairness.policy import make_share_policy
from megha.common.core.node_table import DELTA_STATES
from megha.common.core.policies import ANSWER_STATES
from megha.common.core.policies.priority import DEFAULT_PRIORITY_CLASSES, PriorityClasses, parse_priority_classes
from megha.common.core.queueable import mark_queueable
from megha.common.core.resources import DEFAULT_RESOURCE_NAMES, Resources
from megha.common.core.retry import parse_rule
from megha.common.core.task import JobSpec
from megha.common.limits import MIN_INTERVAL
from megha.common.memory_budget import check_fits
from megha.embedded.faults import Faults
from megha.embedded.system import EmbeddedConfig
from megha.loadgen.dependencies import parse_dependencies, with_dependencies
from megha.loadgen.metrics import RunMetrics, compute_metrics
from megha.loadgen.priority import assign_classes
from megha.loadgen.progress import Advance, Progress
from megha.loadgen.recorder import Recorder, WallClockRecorder
from megha.loadgen.trace import MAX_SECONDS, TraceJob, resolve_trace, synthetic_tasks
from megha.loadgen.workload import WorkloadConfig, build_workload, mark_gangs
from megha.sim.system import PIGEONC_SCHEDULERS, SchedulerSystem, build_system

REPO_ROOT = Path(__file__).resolve().parents[1]
REFERENCE_CLUSTER = REPO_ROOT.parent / "shared" / "constraints" / "reference-cluster-10000-nodes.json"
STRANDED = "still waiting in the scheduler when the system went idle (no free node it knew of could take it)"


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """One replay. `cluster` is "generate", "reference" (the published 10,000-node cluster) or a file path;
    `scheduler` names a `megha.sim.system.SCHEDULERS` entry (Megha itself or a baseline)."""

    trace: str = "syn:250:200"
    first_jobs: int | None = None
    time_scale: float = 1.0
    truncate_durations: bool = False  # truncate the trace's task durations to whole seconds (authors' simulator)
    dephase_arrivals: bool = False  # a job arriving with an earlier one comes 0.01 s later per such job (authors')
    cluster: str = "generate"
    lms: int = 5
    gms: int = 5
    workers_per_partition: int = 400
    node_cpu_millicores: int = 64000
    node_memory_mb: int = 16384
    mode: Literal["slot", "scaled"] = "slot"
    cpu_scale: int = 400  # scaled mode: the drawn CPU request is divided by this (loadgen/workload.py)
    mem_scale: int = 50  # scaled mode: the drawn memory request is divided by this
    matching: str = "random"
    hop_delay: float = 0.0005
    event_order: str = "fifo"  # events due at the same time: a `megha.common.transport.inmemory.EVENT_ORDERS` name
    delta_interval: float = 1.0
    delta_offset: float = 0.0  # LMs' deltas go out at this offset + k x delta_interval (the authors': 0.05 s early)
    seed: int = 0
    users: int = 1
    constraints: bool = True
    realtime: bool = False
    scheduler: str = "megha"
    pigeonc_masters: int = 100  # PigeonC's masters (the paper's 100), each a contiguous group of the nodes
    queues: str = ""  # fair scheduling: "user:share:gm,..." (empty: off)
    share_policy: str = "share"
    faults: Faults | None = None  # simulated crashes and partitions (Megha and centralized only)
    max_attempts: int = 3
    lm_order: str = "round-robin"  # the GM's LM order: a `megha.common.core.policies.LM_ORDERS` name
    queue_order: str = "fifo"  # the GM's queue order: a `megha.common.core.policies.QUEUE_ORDERS` name
    unplaceable: str = "park"  # a task that fits nowhere now: a `megha.common.core.policies.UNPLACEABLE` name
    unsatisfiable: str = "reject"  # a task no node could ever run: a `megha.common.core.policies.UNSATISFIABLE` name
    inconsistent: str = "retry"  # a task refused as inconsistent: a `megha.common.core.policies.INCONSISTENT` name
    waiting_order: str = "shape"  # who of the tasks waiting for a freed node gets it: a `policies.WAITING_ORDERS` name
    answer_states: str = "always"  # an LM's launch answer carries node states: a `policies.ANSWER_STATES` name
    delta_states: str = "latest"  # what an LM's delta reports of a node changed twice: a `node_table.DELTA_STATES` name
    machine_constraints: str = "per-node"  # generated cluster: a `megha.common.machine_classes.MACHINE_DRAWS` name
    decision_costs: str = "zero"  # the time GMs and LMs take to decide: a `megha.common.core.costs.PRESETS` name
    dependencies: str = ""  # jobs depending on earlier ones: `loadgen.dependencies.parse_dependencies` ("": none)
    fail_fraction: float = 0.0  # simulated runs that fail (drawn with the seed; docs/retry.md)
    fail_exit_code: int = 1  # the exit code they fail with
    retry: str = ""  # every trace job's retry rule, `max_attempts:backoff_s[:codes]` (empty: none)
    priority_classes: str = ""  # "name:value,..." (empty: off, unless `job_classes` is given: the default classes)
    job_classes: str = ""  # each job's class drawn as "name:fraction,..." (loadgen/priority.py)
    gangs: float = 0.0  # fraction of jobs that are gangs (docs/gang.md), drawn with `seed`
    gang_sizes: tuple[int, int] = (1, 1 << 30)  # only jobs of this many tasks (least, most) may be gangs
    gang_reserve_after: float | None = None  # seconds a gang waits before its GM holds LMs for it (None: never)
    queueable: float = 0.0  # the fraction of tasks made queueable (chosen with the seed; docs/queueable.md)

    def classes(self) -> PriorityClasses | None:
        """The priority classes of the replay (None: off)."""
        if not (self.priority_classes or self.job_classes):
            return None
        return parse_priority_classes(self.priority_classes or DEFAULT_PRIORITY_CLASSES)

    def fairness(self) -> FairnessConfig | None:
        return parse_queues(self.queues, self.share_policy) if self.queues else None

    @property
    def node_capacity(self) -> tuple[int, int]:
        return (self.node_cpu_millicores, self.node_memory_mb)


DEFAULTS = ReplayConfig()
"""A replay's defaults."""


@dataclass(slots=True)
class ReplayResult:
    config: ReplayConfig
    cluster: ClusterSpec
    system: SchedulerSystem
    recorder: Recorder
    metrics: RunMetrics
    wall_seconds: float


def build_cluster(config: ReplayConfig) -> ClusterSpec:
    """The data centre a replay runs on."""
    if config.cluster == "generate":
        return generate_cluster(
            config.lms,
            config.gms,
            config.workers_per_partition,
            config.node_capacity,
            config.seed,
            machine_constraints=config.machine_constraints,
        )
    if config.machine_constraints != DEFAULTS.machine_constraints:
        raise ValueError(
            f"machine constraints {config.machine_constraints!r} are drawn for a generated cluster (--cluster "
            f"generate), not for {config.cluster!r}, whose nodes carry their own"
        )
    path = REFERENCE_CLUSTER if config.cluster == "reference" else Path(config.cluster)
    if not path.exists():
        hint = (
            " (the reference cluster lives in ../shared/constraints; pass its path)"
            if config.cluster == "reference"
            else ""
        )
        raise FileNotFoundError(f"cluster file {path} not found{hint}")
    return in_resource_order(load_cluster(path, config.node_capacity), DEFAULT_RESOURCE_NAMES, path)


def read_jobs(config: ReplayConfig) -> list[TraceJob]:
    """The trace's jobs as `config` reads them (its first jobs, time scale, durations and arrivals)."""
    return resolve_trace(
        config.trace,
        config.first_jobs,
        config.time_scale,
        whole_seconds=config.truncate_durations,
        dephase=config.dephase_arrivals,
    )


def slot_of(config: ReplayConfig, cluster: ClusterSpec | None) -> Resources:
    """What a task requests in slot mode, where it holds a whole node: the one size of `cluster`'s nodes when they
    all have one (a cluster file in Megha's format carries its own), else --node-cpu and --node-mem (the size of a
    generated or reference-format cluster's nodes; with nodes of several sizes, tasks hold that much of them)."""
    if cluster is None:
        return config.node_capacity
    sizes = {capacity for row in cluster.partitions for p in row for capacity in p.capacities}
    return next(iter(sizes)) if len(sizes) == 1 else config.node_capacity


def trace_workload(
    config: ReplayConfig, trace_jobs: Sequence[TraceJob], entry_points: int, cluster: ClusterSpec | None = None
) -> list[tuple[int, JobSpec]]:
    """The jobs of `trace_jobs` as `config` draws them (requests, constraints, users, queues) for a system of
    `entry_points` GMs on `cluster` (its node size is a slot, `slot_of`), before a replay's other marks
    (dependencies, retries, classes, gangs, queueable)."""
    fairness = config.fairness()
    return build_workload(
        trace_jobs,
        WorkloadConfig(
            config.mode,
            config.seed,
            entry_points,
            slot_of(config, cluster),
            config.users,
            cpu_scale=config.cpu_scale,
            mem_scale=config.mem_scale,
            queues=fairness.queues if fairness is not None else (),
            constraints=config.constraints,
        ),
    )


def replay(config: ReplayConfig, progress: Progress | None = None) -> ReplayResult:
    """Replay `config.trace` through the embedded system and measure it; `progress` says what runs and, on a
    terminal, how far it got."""
    if config.cluster == "generate":  # before building: a data centre of 10**8 nodes takes minutes to build
        nodes = config.lms * config.gms * config.workers_per_partition
        check_memory(config, synthetic_tasks(config.trace, config.first_jobs) or 0, nodes, config.gms)
    cluster = build_cluster(config)
    trace_jobs = read_jobs(config)
    check_memory(config, sum(len(job.durations) for job in trace_jobs), cluster.num_nodes, cluster.num_gms)
    recorder = WallClockRecorder() if config.realtime else Recorder()
    fairness = config.fairness()
    if fairness is not None:
        make_share_policy(fairness.policy)  # fail early on an unknown policy name
    if config.faults is not None and config.scheduler not in ("megha", "centralized"):
        raise ValueError(f"failures are simulated for Megha and centralized, not {config.scheduler}")
    gm_policies = (
        ("unplaceable", config.unplaceable),
        ("unsatisfiable", config.unsatisfiable),
        ("inconsistent", config.inconsistent),
        ("waiting-order", config.waiting_order),
    )
    for what, name in (*gm_policies, ("lm-order", config.lm_order), ("gang-reserve-after", config.gang_reserve_after)):
        if name != getattr(DEFAULTS, what.replace("-", "_")) and config.scheduler not in ("megha", "centralized"):
            raise ValueError(f"--{what} {name} is a policy of Megha's GMs (megha, centralized), not {config.scheduler}")
    if config.answer_states not in ANSWER_STATES:
        raise ValueError(f"unknown --answer-states {config.answer_states!r}; choose one of {sorted(ANSWER_STATES)}")
    if config.answer_states != DEFAULTS.answer_states and config.scheduler not in ("megha", "centralized"):
        raise ValueError(f"--answer-states {config.answer_states} is a policy of Megha's LMs, not {config.scheduler}")
    if config.delta_states not in DELTA_STATES:
        raise ValueError(f"unknown --delta-states {config.delta_states!r}; choose one of {list(DELTA_STATES)}")
    if config.delta_states != DEFAULTS.delta_states and config.scheduler not in ("megha", "centralized"):
        raise ValueError(f"--delta-states {config.delta_states} is a policy of Megha's LMs, not {config.scheduler}")
    if not MIN_INTERVAL <= config.delta_interval <= MAX_SECONDS:
        raise ValueError(
            f"--delta-interval {config.delta_interval} must be between {MIN_INTERVAL:g} and {MAX_SECONDS:g} seconds"
        )
    if not 0 <= config.hop_delay <= MAX_SECONDS:
        raise ValueError(f"--hop-delay {config.hop_delay} must be between 0 and {MAX_SECONDS:g} seconds")
    if not 0 <= config.delta_offset < config.delta_interval:
        raise ValueError(
            f"--delta-offset {config.delta_offset} must be at least 0 and less than --delta-interval "
            f"{config.delta_interval}"
        )
    if config.delta_offset and config.scheduler not in ("megha", "centralized"):
        raise ValueError(f"--delta-offset is a timing of Megha's LM deltas, not {config.scheduler}'s")
    rule = parse_rule(config.retry) if config.retry else None
    if (rule is not None or config.fail_fraction) and config.scheduler not in ("megha", "centralized"):
        raise ValueError(f"failed runs and retry rules are simulated for Megha and centralized, not {config.scheduler}")
    classes = config.classes()
    if classes is not None and config.scheduler not in ("megha", "centralized"):
        raise ValueError(f"priority classes are a policy of Megha's GMs (megha, centralized), not {config.scheduler}")
    if not 0.0 <= config.queueable <= 1.0:
        raise ValueError(f"--queueable {config.queueable} is a fraction of the tasks, between 0 and 1")
    if config.queueable and config.scheduler not in ("megha", "centralized"):
        raise ValueError(f"queueable tasks are Megha's (megha, centralized), not {config.scheduler}'s")
    if config.pigeonc_masters < 1:
        raise ValueError(f"--pigeonc-masters {config.pigeonc_masters} must be at least 1")
    pigeonc = None
    if config.pigeonc_masters != DEFAULTS.pigeonc_masters:
        if config.scheduler not in PIGEONC_SCHEDULERS:
            raise ValueError(f"--pigeonc-masters is PigeonC's (pigeonc, pigeonc-published), not {config.scheduler}'s")
        from megha.sim.pigeonc import PigeonCConfig  # a baseline's module, imported only when it runs

        pigeonc = PigeonCConfig(masters=config.pigeonc_masters)
    costs = decision_costs(config.decision_costs)
    chains = parse_dependencies(config.dependencies)
    if chains is not None and config.scheduler not in ("megha", "centralized"):
        raise ValueError(f"job dependencies are simulated for Megha and centralized, not {config.scheduler}")
    if config.realtime and not costs.zero:
        raise ValueError("decision costs are modelled on the virtual clock; --realtime takes the machine's own")
    system = build_system(
        config.scheduler,
        cluster,
        EmbeddedConfig(
            config.matching,
            config.hop_delay,
            config.delta_interval,
            config.seed,
            config.realtime,
            fairness,
            config.faults,
            config.max_attempts,
            costs,
            config.lm_order,
            config.queue_order,
            config.unplaceable,
            config.unsatisfiable,
            dependencies=chains is not None,
            fail_fraction=config.fail_fraction,
            fail_exit_code=config.fail_exit_code,
            priority_classes=classes is not None,
            inconsistent=config.inconsistent,
            answer_states=config.answer_states,
            delta_states=config.delta_states,
            gang_reserve_after=config.gang_reserve_after,
            event_order=config.event_order,
            delta_offset=config.delta_offset,
            waiting_order=config.waiting_order,
        ),
        recorder,
        pigeonc,
    )
    workload = trace_workload(config, trace_jobs, system.entry_points, cluster)
    if chains is not None:
        workload = with_dependencies(workload, chains, config.seed)
    if rule is not None:
        workload = [(gm, replace(job, retry=rule)) for gm, job in workload]
    if classes is not None:
        workload = assign_classes(workload, classes, config.job_classes, config.seed)
    if config.gangs:
        if config.scheduler not in ("megha", "centralized"):
            raise ValueError(f"gangs are scheduled by Megha's GMs (megha, centralized), not {config.scheduler}")
        workload = mark_gangs(workload, config.gangs, config.seed, config.gang_sizes)
    if config.queueable:
        if config.gangs:
            raise ValueError("--queueable is not for gangs (a queued member would leave its gang part-started)")
        workload = [(gm, mark_queueable(job, config.queueable, config.seed)) for gm, job in workload]
    for gm, job in workload:
        recorder.expect(gm, job)
        system.submit(gm, job)
    total = len(recorder.tasks)
    if progress is not None:
        progress.note(
            f"replaying {len(workload):,} jobs ({total:,} tasks) on {cluster.num_nodes:,} nodes "
            f"({cluster.num_lms} LMs x {cluster.num_gms} GMs), scheduler {config.scheduler}, {config.mode} mode, "
            f"{config.matching} matching"
        )
    tracking = progress.track("replaying", total, "tasks") if progress is not None and progress.bar else nullcontext()
    with tracking as advance:
        start = time.perf_counter()
        if isinstance(recorder, WallClockRecorder):
            recorder.start()
        system.run(_bar_hook(recorder, advance, config.realtime) if advance is not None else None)
        wall = time.perf_counter() - start
    recorder.mark_stranded(system.stranded_tasks(), STRANDED)
    metrics = compute_metrics(
        recorder.tasks,
        list(recorder.jobs.values()),
        cluster.total_capacity(),
        cluster.resource_names,
        wall,
        clock="wall" if config.realtime else "virtual",
    )
    return ReplayResult(config, cluster, system, recorder, metrics, wall)


REPLAY_TASK_BYTES = 1_300
"""The memory a replay holds per task: its spec, events and record (1.36 KB measured on 10,000 nodes, 2026-11-30:
`/usr/bin/time -f %M megha replay --quiet --trace syn:1000:400` peaked at 595 MB and `syn:1000:100` at 188 MB,
407 MB for the 300,000 tasks more)."""
NODE_VIEW_BYTES = 130
"""The memory a replay holds per node for each copy of its state, its LM's and each GM's view (130-139 B
measured: 500,000 nodes and 10 GMs in 782 MB, 1,000,000 nodes and 5 GMs in 910 MB, less the 76 MB of 625 nodes,
2026-11-30: `/usr/bin/time -f %M megha replay --quiet --trace syn:10:2 --lms 50 --gms 10 --workers-per-partition
1000`, and `--lms 100 --gms 5 --workers-per-partition 2000`, against `--lms 5 --gms 5 --workers-per-partition 10`)."""


def check_memory(config: ReplayConfig, tasks: int, nodes: int, gms: int) -> None:
    """Refuse (MemoryBudgetError, a ValueError) a replay of `tasks` on `nodes` whose estimated memory is over what the
    machine has available: `megha replay --lms 100000` would build for minutes and then be killed."""
    copies = gms + 1 if config.scheduler in ("megha", "centralized") else 1  # an LM table, and a view per GM
    held = f"{copies} copies" if copies > 1 else "1 copy"
    check_fits(
        tasks * REPLAY_TASK_BYTES + nodes * copies * NODE_VIEW_BYTES,
        f"this replay ({tasks:,} task{'s' * (tasks != 1)} on {nodes:,} nodes, {held} of each node's state)",
        "replay fewer jobs (--first-jobs) or a smaller data centre",
    )


def decision_costs(name: str) -> DecisionCosts:
    """The decision-time model `name` ("zero", "calibrated")."""
    if name not in PRESETS:
        raise ValueError(f"decision costs {name!r}: choose from {', '.join(PRESETS)}")
    return PRESETS[name]


def _bar_hook(recorder: Recorder, advance: Advance, realtime: bool) -> Callable[[float], None]:
    """An event hook that moves the progress bar to the tasks ended (finished or failed) so far: every 1,024 events
    on the virtual clock, and at every event on the wall clock, whose events are few and come at their time (a
    bar moved every 1,024 of them would stand still through a whole run)."""
    clock = "s" if realtime else "s simulated"

    def show(now: float) -> None:
        advance(recorder.finished_count + recorder.failed_count, f"t={now:,.0f} {clock}")

    if realtime:
        return show
    events = 0

    def on_event(now: float) -> None:
        nonlocal events
        events += 1
        if not events & 1023:
            show(now)

    return on_event


def config_dict(config: ReplayConfig) -> dict[str, object]:
    return asdict(config)
