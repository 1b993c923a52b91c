"""Wires GM, LM and simulated-worker cores to the in-memory transport and runs them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from megha.common.core.cluster import ClusterSpec
from megha.common.core.costs import DecisionCosts
from megha.common.core.dependencies import JobEnds, ParentEnded
from megha.common.core.fairness.config import FairnessConfig
from megha.common.core.gm import GlobalMaster, Unschedulable
from megha.common.core.lm import LocalMaster
from megha.common.core.messages import DeltaTick, Output, gm_address, lm_address, worker_address
from megha.common.core.observer import CoreObserver, observe
from megha.common.core.placement.choice import make_choice
from megha.common.core.policies import ANSWER_STATES, gm_policies
from megha.common.core.retry import SimulatedFailures
from megha.common.core.task import JobSpec
from megha.common.core.worker import SimulatedExecution
from megha.embedded.faults import Faults
from megha.embedded.wiring import SimulatedSystem, Submit

if TYPE_CHECKING:
    from megha.embedded.injector import FaultInjector

LOADGEN = "loadgen"
QUIET_TICKS_BEFORE_STOP = 3
GM_COUNTERS = ("repartitions", "inconsistencies", "reschedules", "preemption_attempts", "dropped", "retries")


@dataclass(frozen=True, slots=True)
class EmbeddedConfig:
    """How the embedded system runs. `hop_delay` is the one-way network delay per message, in seconds;
    `fairness` turns on user queues, shares and preemption; `faults` crashes workers, LMs and GMs; `costs` is the
    time GMs and LMs take to decide (None: none); `lm_order`, `queue_order`, `unplaceable`, `unsatisfiable`,
    `inconsistent` and `waiting_order` name the GMs' policies (`megha.common.core.policies`), `answer_states` and
    `delta_states` the LMs' (whether an answer to a launch batch carries node states, what a delta reports of a
    node changed twice); `dependencies` lets jobs wait for other jobs (each job's end is then tracked and told to
    every GM, docs/dependencies.md). `fail_fraction` of the simulated runs fail with exit code `fail_exit_code`
    (drawn with the seed; docs/retry.md). `priority_classes` turns on priority classes (the tasks' `priority` values
    order queues and may preempt lower ones). `event_order` orders the events due at the same time
    (`megha.common.transport.inmemory.EVENT_ORDERS`; "seeded" draws with `seed`). The LMs' deltas go out at
    `delta_offset` + k x `delta_interval`."""

    matching: str = "random"
    hop_delay: float = 0.0005
    delta_interval: float = 1.0
    seed: int = 0
    realtime: bool = False
    fairness: FairnessConfig | None = None
    faults: Faults | None = None
    max_attempts: int = 3
    costs: DecisionCosts | None = None
    lm_order: str = "round-robin"
    queue_order: str = "fifo"
    unplaceable: str = "park"
    unsatisfiable: str = "reject"
    dependencies: bool = False  # jobs may name parents (`JobSpec.depends_on`); job ends are routed to the GMs
    fail_fraction: float = 0.0
    fail_exit_code: int = 1
    priority_classes: bool = False
    inconsistent: str = "retry"
    answer_states: str = "always"  # whether an LM's launch answer carries node states: an `ANSWER_STATES` name
    delta_states: str = "latest"  # what an LM's delta reports of a node changed twice: a `DELTA_STATES` name
    gang_reserve_after: float | None = None  # seconds a gang waits before its GM holds LMs for it (None: never)
    event_order: str = "fifo"  # the order of events due at the same time: an `inmemory.EVENT_ORDERS` name
    delta_offset: float = 0.0  # LMs' deltas go out at this offset + k x delta_interval (seconds)
    waiting_order: str = "shape"  # who of the tasks waiting for a freed node gets it: a `WAITING_ORDERS` name


class EmbeddedSystem(SimulatedSystem):
    """G GMs, L LMs and one simulated-execution worker pool per LM, joined by an EventLoop; jobs are submitted to
    GMs."""

    def __init__(self, cluster: ClusterSpec, config: EmbeddedConfig, observer: CoreObserver | None = None) -> None:
        super().__init__(cluster, config, observer, cluster.num_gms, "GM", gm_address)
        if config.dependencies and config.faults is not None:
            raise ValueError("job dependencies are not simulated with faults (a crashed GM forgets its waiting jobs)")
        self.job_ends = JobEnds(self._job_ended) if config.dependencies else None  # the GMs' job ends, told on
        self.loop.background(DeltaTick)
        self.faults: FaultInjector | None = None
        if config.faults is not None:
            # Imported only for a run with faults: the injector and its outages are 25 KB of source that a run
            # without would compile for nothing where bytecode is not written.
            from megha.embedded.injector import FaultInjector

            self.faults = FaultInjector(self, config.faults)
        self.outages = outages = self.faults.outages if self.faults is not None else None
        self.gms = [self.new_gm(g) for g in range(cluster.num_gms)]
        self.lms = [self.new_lm(lm) for lm in range(cluster.num_lms)]
        self.workers = [
            SimulatedExecution(lm, self.observer, self._failures(lm, config), cluster.lm_capacities(lm))
            for lm in range(cluster.num_lms)
        ]
        self.retired: Counter[str] = Counter()  # counters of GM and LM cores lost in crashes
        for g in range(cluster.num_gms):
            handler = self._gm_handler(g)
            self.loop.register(gm_address(g), outages.gm_endpoint(g, handler) if outages else handler, "gm")
        for lm in self.lms:
            self.loop.register(lm_address(lm.lm_id), outages.lm_endpoint(lm.lm_id) if outages else lm.handle, "lm")
        for worker in self.workers:
            endpoint = outages.worker_endpoint(worker) if outages else worker.handle
            self.loop.register(worker_address(worker.lm_id), endpoint)
        self._quiet_ticks = 0

    @staticmethod
    def _failures(lm: int, config: EmbeddedConfig) -> SimulatedFailures | None:
        """Which runs of LM `lm`'s workers fail (None: none)."""
        if not config.fail_fraction:
            return None
        return SimulatedFailures(config.fail_fraction, config.fail_exit_code, config.seed, lm)

    def new_gm(self, g: int) -> GlobalMaster:
        """GM `g`'s core, as it starts (or restarts after a crash)."""
        config = self.config
        policies = gm_policies(
            g,
            self.cluster,
            config.fairness,
            make_choice(config.matching),
            config.queue_order,
            config.lm_order,
            config.unplaceable,
            config.unsatisfiable,
            config.priority_classes,
            config.inconsistent,
            config.gang_reserve_after,
            config.waiting_order,
        )
        return GlobalMaster(
            g,
            self.cluster,
            seed=config.seed,
            observer=self.loop.stamped(self._gm_observer(g)),
            max_attempts=config.max_attempts,
            policies=policies,
        )

    def _gm_observer(self, g: int) -> CoreObserver:
        """What GM `g`'s core reports to: the system's observer (through the outages, with faults), and the job ends
        with dependencies."""
        observer = self.outages.gm_observer(g) if self.outages else self.observer
        return observer if self.job_ends is None else observe(observer, self.job_ends)

    def new_lm(self, lm: int, incarnation: int = 0) -> LocalMaster:
        """LM `lm`'s core, as it starts (or restarts after a crash, as `incarnation`)."""
        config = self.config
        outages = self.outages
        return LocalMaster(
            lm,
            self.cluster.partitions[lm],
            self.cluster.resource_names,
            self.loop.stamped(self.observer),
            config.delta_interval,
            config.fairness,
            incarnation,
            outages.ended_runs_kept if outages else 0,
            config.priority_classes,
            answer_states=ANSWER_STATES[config.answer_states](),
            delta_states=config.delta_states,
            delta_offset=config.delta_offset,
        )

    def retire(self, core: GlobalMaster | LocalMaster) -> None:
        """Keep the counts of a core lost in a crash."""
        if isinstance(core, GlobalMaster):
            self.retired.update({name: getattr(core, name) for name in (*GM_COUNTERS, "failures_retried")})
        else:
            self.retired["preemptions"] += core.preemptions

    def _gm_handler(self, g: int) -> Callable[[object, float], list[Output]]:
        gms = self.gms

        def handle(msg: object, now: float) -> list[Output]:
            self._quiet_ticks = 0
            gm = gms[g]
            if isinstance(msg, Submit):
                if msg.job.depends_on:
                    return self.accept(self._submit_child(gm), msg.job, now)
                return self.accept(gm.submit, msg.job, now)
            if isinstance(msg, ParentEnded):
                return gm.parent_ended(msg.job_id, msg.outcome, now)
            return gm.handle(msg, now)

        return handle

    def _submit_child(self, gm: GlobalMaster) -> Callable[[JobSpec, float], list[Output]]:
        """Submission of a job with parents at `gm`: refused (Unschedulable naming `depends_on.i`) for a parent no GM
        has accepted; the ends of parents that ended already are told at once."""

        def submit(job: JobSpec, now: float) -> list[Output]:
            job_ends = self.job_ends
            if job_ends is None:
                raise Unschedulable(f"job {job.job_id}: dependencies are off in this system", "depends_on")
            for i, parent in enumerate(job.depends_on):
                if not job_ends.known(parent):
                    raise Unschedulable(f"job {job.job_id}: no job {parent}", f"depends_on.{i}")
            outputs = gm.submit(job, now)
            for parent in job.depends_on:
                if (outcome := job_ends.outcome(parent)) is not None:
                    outputs += gm.parent_ended(parent, outcome, now)
            return outputs

        return submit

    def _job_ended(self, job_id: str, outcome: str, now: float) -> None:
        """Tell every GM whose jobs wait for `job_id` that it ended, one hop later."""
        for g, gm in enumerate(self.gms):
            if job_id in gm.dependencies.children:
                self.loop.post(now + self.config.hop_delay, gm_address(g), ParentEnded(job_id, outcome))

    def run(self, on_event: Callable[[float], None] | None = None) -> None:
        """Run until every accepted task has finished (or nothing more can happen)."""
        for lm in self.lms:
            self.loop.dispatch(lm.start(self.loop.now))
        faults = self.faults
        if faults is not None:
            faults.start(self.loop.now)
        self.loop.run(self._keep_going, on_event, faults.settled if faults is not None else None)

    def _keep_going(self) -> bool:
        """Only periodic deltas remain: keep ticking a few times while some GM still holds tasks, so deltas can
        reveal free resources its view missed; then stop."""
        if not any(gm.queue or gm.waiting or gm.gangs.waiting for gm in self.gms):
            return False
        self._quiet_ticks += 1
        return self._quiet_ticks <= QUIET_TICKS_BEFORE_STOP * len(self.lms)

    def counters(self) -> dict[str, int]:
        """Repartitions, inconsistencies and reschedules summed over GMs (the LM-side counts agree), including
        those of cores lost in crashes; with faults, the crashes and retries."""
        retired = self.retired
        counts = {name: sum(getattr(gm, name) for gm in self.gms) + retired[name] for name in GM_COUNTERS[:-1]}
        counts["preemptions"] = sum(lm.preemptions for lm in self.lms) + retired["preemptions"]
        if self.faults is not None:
            crashes = self.faults.crashes
            counts |= {f"{kind}_crashes": crashes[kind] for kind in ("worker", "lm", "gm")}
            counts["partitions"] = crashes["partition"]
            counts["retries"] = sum(gm.retries for gm in self.gms) + retired["retries"]
        if self.config.fail_fraction or any(gm.failures_retried for gm in self.gms):
            counts["failures_retried"] = sum(gm.failures_retried for gm in self.gms) + retired["failures_retried"]
        return counts

    def stranded_tasks(self) -> list[str]:
        """Task ids still held by a GM when the run ended (none in a healthy run)."""
        return [t.task_id for gm in self.gms for t in (*gm.queue, *gm.waiting_tasks(), *gm.dependencies.tasks())]
