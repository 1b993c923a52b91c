"""GM and LM outages in a simulation, lived through as the services live through them.

A crashed GM loses its core's memory. Its durable records stay (`GMJournal`, the services' write-ahead journal:
the jobs it accepted and which of their tasks ended); completions and deltas for it wait in its queue (the
broker's queues are durable), submissions wait too (clients retry), and answers to its calls die with it. When
it restarts it asks every LM for its report (`megha.common.core.recovery.lm_report`; one hop each way, and not
before every LM is up and reachable), rebuilds from the reports, its records and the messages that waited
(`plan_recovery`, `GlobalMaster.recover`), so that nothing running or finished is launched again, then handles
the messages that waited, in order.

A crashed LM loses its core's memory; its workers keep running their tasks and their reports wait (durable
queue), launches wait (GMs retry them until the LM is back), preemption requests fail (GMs do not repeat
them) and so do its decisions about its workers' liveness. It restarts as the next incarnation (node versions
above any the last one reached, so GMs take its states as newer): its workers register again with the runs they
hold (`AgentMemory`; one hop each way, after any report they sent before), it adopts those runs, takes the nodes
whose worker is dead out of service, applies what waited, reports every node to every GM and tells each GM
which of its runs it holds (`RunsHeld`): a GM's run on it that it does not hold was lost with its worker
(`runs_lost`) and runs again.

A partitioned (cut off) LM or GM keeps its memory: messages to it wait until the partition heals, and so do the
LM's decisions about its workers' liveness (heartbeats are not modelled: a partition takes no node for dead).
A fault that strikes an LM or GM that is not up is ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Literal

from megha.common.core.lm import LocalMaster
from megha.common.core.messages import (
    DeltaTick,
    LaunchResponse,
    Output,
    Placement,
    PreemptRequest,
    PreemptResponse,
    Send,
    WorkerLaunch,
    WorkerReport,
    gm_address,
)
from megha.common.core.node_table import VERSION_BITS
from megha.common.core.observer import CoreObserver, observe
from megha.common.core.recovery import LMReport, RunsHeld, lm_report, plan_recovery, runs_held, runs_lost
from megha.common.core.retry import RetryDue
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.core.worker import SimulatedExecution
from megha.common.transport.inmemory import Handler
from megha.embedded.faults import Faults, Kind
from megha.embedded.wiring import Submit

if TYPE_CHECKING:
    from megha.common.core.gm import GlobalMaster
    from megha.embedded.system import EmbeddedSystem

State = Literal["up", "down", "recovering", "cut"]
LMAction = Callable[[LocalMaster, float], list[Output]]
ENDED_RUNS_KEPT = 100_000
"""Ended runs each LM remembers when GMs may crash (a restarting GM learns which of its runs ended)."""
HELD_WORK = (Submit, RetryDue)
"""Messages waiting for a GM that bring it tasks no core holds meanwhile (`Outages.work_held_back`)."""


class GMJournal(CoreObserver):
    """A GM's durable records, as the services' journal keeps them: the tasks of the jobs it accepted, in arrival
    order, the ids of those that ended (finished or failed), and the failed runs their jobs' retry rules run again
    (docs/retry.md). It observes its GM beside the run's recorder."""

    def __init__(self) -> None:
        self.accepted: dict[str, TaskSpec] = {}
        self.ended: set[str] = set()
        self.ruled: list[JobSpec] = []  # jobs with a retry rule
        self.retried: dict[str, tuple[int, int]] = {}  # task id -> (its next attempt, failures retried)
        self.gangs: dict[str, float] = {}  # gang jobs: job id -> JobSpec.gang

    def job_arrived(self, job: JobSpec, gm: int, now: float) -> None:
        self.accepted.update((t.task_id, t) for t in job.tasks)
        if job.retry is not None:
            self.ruled.append(job)
        if job.gang is not None:
            self.gangs[job.job_id] = job.gang

    def task_retry_scheduled(self, task: TaskSpec, reason: str, at: float, now: float) -> None:
        self.retried[task.task_id] = (task.attempt + 1, self.retried.get(task.task_id, (0, 0))[1] + 1)

    def accepted_tasks(self) -> list[TaskSpec]:
        """The accepted tasks, each a task run again under its job's retry rule at the attempt it runs as next."""
        retried = self.retried
        if not retried:
            return list(self.accepted.values())
        return [
            t if t.task_id not in retried else replace(t, attempt=retried[t.task_id][0]) for t in self.accepted.values()
        ]

    def restore_rules(self, core: GlobalMaster) -> None:
        """Give a restarted GM core its open jobs' retry rules and the failures retried so far."""
        for job in self.ruled:
            open_ids = [t.task_id for t in job.tasks if t.task_id not in self.ended]
            core.retry.restore(
                job, len(open_ids), {tid: self.retried[tid][1] for tid in open_ids if tid in self.retried}
            )

    def task_completed(self, task: TaskSpec, error: str, now: float, forwarded: bool) -> None:
        self.ended.add(task.task_id)

    def task_failed(self, task: TaskSpec, reason: str, now: float) -> None:
        self.ended.add(task.task_id)


class AgentMemory:
    """What an LM's worker agents know of their runs, as a real agent does: each run's placement (which names the
    GM that placed it). A rebuilt LM adopts the runs from it, and every report names the run's GM
    (`FinishedTask.gm`), so that an LM that did not place a run forwards its report to that GM."""

    def __init__(self, worker: SimulatedExecution) -> None:
        self.worker = worker
        self.runs: dict[str, Placement] = {}

    def handle(self, msg: object, now: float) -> list[Output]:
        if type(msg) is WorkerLaunch:
            dead = self.worker.dead
            self.runs.update((p.task.task_id, p) for p in msg.launches if p.node not in dead)
        out = self.worker.handle(msg, now)
        for o in out:
            if type(o.msg) is WorkerReport:
                for item in o.msg.finished:
                    p = self.runs.pop(item.task_id, None)
                    if p is not None:
                        item.gm = p.gm
        return out

    def crashed(self, nodes: set[int]) -> None:
        """The workers of `nodes` died with their runs."""
        self.runs = {tid: p for tid, p in self.runs.items() if p.node not in nodes}


@dataclass(frozen=True, slots=True)
class CallFailed:
    """To a GM: its preemption request `seq` to LM `lm` got no answer."""

    lm: int
    seq: int
    reason: str


@dataclass(frozen=True, slots=True)
class _Deferred:
    """A worker-liveness change for an LM that is down or cut off, applied in turn once it is up."""

    act: LMAction


@dataclass(frozen=True, slots=True)
class Later:
    """A step of the fault machinery (a fault, a restart, a message of a recovery), run at its time: `act(now)`."""

    act: Callable[[float], list[Output]]


class Outages:
    """The up/down/cut state of every GM and LM, the messages waiting for each, and their restarts. It guards the
    GM, LM and worker endpoints of an embedded system (`gm_endpoint`, `lm_endpoint`, `worker_endpoint`)."""

    @staticmethod
    def needed(faults: Faults) -> bool:
        return any(faults.of(kind) or faults.cuts(kind) for kind in ("lm", "gm"))

    def __init__(self, system: EmbeddedSystem, faults: Faults, post: Callable[[float, Later], None]) -> None:
        self.system = system
        self.faults = faults
        self.post = post
        self.hop = system.config.hop_delay
        gms, lms = system.cluster.num_gms, system.cluster.num_lms
        self.gm_state: list[State] = ["up"] * gms
        self.lm_state: list[State] = ["up"] * lms
        self.lm_back_at = [0.0] * lms
        self.gm_inbox: list[list[object]] = [[] for _ in range(gms)]
        self.lm_inbox: list[list[object]] = [[] for _ in range(lms)]
        self.journals = [GMJournal() for _ in range(gms)] if faults.of("gm") else None
        self.gm_terms = [1] * gms  # each GM's term: one more at each restart, as a service's claim at the LMs
        self.ended_runs_kept = ENDED_RUNS_KEPT if faults.of("gm") else 0
        self.agents: dict[int, AgentMemory] | None = None
        self._gm_handlers: dict[int, Handler] = {}
        self._lm_handlers: dict[int, Handler] = {}

    # ------------------------------------------------------------ endpoints

    def gm_observer(self, gm: int) -> CoreObserver:
        """GM `gm`'s observer: the run's, and its journal's when GMs may crash."""
        if self.journals is None:
            return self.system.observer
        return observe(self.journals[gm], self.system.observer)

    def gm_endpoint(self, g: int, inner: Handler) -> Handler:
        """GM `g`'s endpoint: `inner` while it is up; otherwise messages wait (answers to a crashed GM's calls are
        lost)."""

        def handle(msg: object, now: float) -> list[Output]:
            state = self.gm_state[g]
            if state == "up":
                if type(msg) is RunsHeld:
                    lost = runs_lost(self.system.gms[g].running, msg)
                    return inner(lost, now) if lost is not None else []
                if type(msg) is CallFailed:
                    return self.system.gms[g].call_failed(msg.lm, msg.seq, msg.reason, now)
                return inner(msg, now)
            if state != "cut" and isinstance(msg, LaunchResponse | PreemptResponse | CallFailed):
                return []
            self.gm_inbox[g].append(msg)
            return []

        self._gm_handlers[g] = handle
        return handle

    def lm_endpoint(self, lm: int) -> Handler:
        """LM `lm`'s endpoint: the current incarnation's core while it is up; otherwise messages wait, but a
        preemption request to a crashed LM fails at once, and a crashed incarnation's timer is dropped."""
        lms = self.system.lms

        def handle(msg: object, now: float) -> list[Output]:
            state = self.lm_state[lm]
            if state == "up":
                return lms[lm].handle(msg, now)
            if state != "cut":
                if isinstance(msg, PreemptRequest):
                    return [Send(gm_address(msg.gm), CallFailed(lm, msg.seq, f"LM {lm} is down"))]
                if isinstance(msg, DeltaTick):
                    return []
            self.lm_inbox[lm].append(msg)
            return []

        self._lm_handlers[lm] = handle
        return handle

    def worker_endpoint(self, worker: SimulatedExecution) -> Handler:
        """The endpoint of an LM's workers: with their memory of runs when LMs may crash."""
        if not self.faults.of("lm"):
            return worker.handle
        if self.agents is None:
            self.agents = {}
        memory = self.agents[worker.lm_id] = AgentMemory(worker)
        return memory.handle

    def worker_crashed(self, lm: int, nodes: set[int]) -> None:
        if self.agents is not None:
            self.agents[lm].crashed(nodes)

    def at_lm(self, lm: int, act: LMAction, now: float) -> list[Output]:
        """Apply a worker-liveness change to LM `lm`, or keep it with the messages waiting for the LM."""
        if self.lm_state[lm] != "up":
            self.lm_inbox[lm].append(_Deferred(act))
            return []
        return act(self.system.lms[lm], now)

    def work_held_back(self) -> bool:
        """Some GM that is not up holds back work that no core holds: a job submitted to it, or a task's retry
        coming due (between its runs a task is in no GM's queue). What else waits for a GM or LM is about tasks a
        core holds (a crashed one's as they were), or none: deltas, answers, liveness changes."""
        return any(type(msg) in HELD_WORK for inbox in self.gm_inbox for msg in inbox)

    # --------------------------------------------------------------- faults

    def strike(self, kind: Kind, index: int, partition: bool, now: float, down: float) -> bool:
        """Crash (or cut off) LM or GM `index` for `down` seconds; False when it is not up."""
        states = self.gm_state if kind == "gm" else self.lm_state
        if states[index] != "up":
            return False
        states[index] = "cut" if partition else "down"
        if kind == "lm":  # when it is up again (a restart takes its workers' registration: a hop each way)
            self.lm_back_at[index] = now + down + (0.0 if partition else 2 * self.hop)
        self.post(now + down, Later(partial(self._back, kind, index)))
        return True

    def _back(self, kind: Kind, index: int, now: float) -> list[Output]:
        """LM or GM `index` is back: cut off, it gets what waited for it; crashed, it starts recovering (a GM asks
        the LMs for their reports, an LM's workers register again)."""
        states = self.gm_state if kind == "gm" else self.lm_state
        if states[index] == "cut":
            states[index] = "up"
            return self._deliver_gm(index, now) if kind == "gm" else self._deliver_lm(index, now)
        states[index] = "recovering"
        self.post(now + self.hop, Later(partial(self._ask_lms if kind == "gm" else self._ask_workers, index)))
        return []

    # ------------------------------------------------------------------ GMs

    def _ask_lms(self, g: int, now: float) -> list[Output]:
        """The LMs answer a restarted GM (one hop later); an LM that is down or cut off answers once it is back."""
        away = [lm for lm, state in enumerate(self.lm_state) if state != "up"]
        if away:
            self.post(max(self.lm_back_at[lm] for lm in away) + self.hop, Later(partial(self._ask_lms, g)))
        else:
            reports = [lm_report(lm, g) for lm in self.system.lms]
            self.post(now + self.hop, Later(partial(self._recover, g, reports)))
        return []

    def _recover(self, g: int, reports: list[LMReport], now: float) -> list[Output]:
        assert self.journals is not None
        system = self.system
        system.retire(system.gms[g])
        core = system.gms[g] = system.new_gm(g)
        journal = self.journals[g]
        ruled = {job.job_id for job in journal.ruled}
        self.gm_terms[g] += 1
        term = self.gm_terms[g]
        plan = plan_recovery(g, journal.accepted_tasks(), journal.ended, reports, self.gm_inbox[g], ruled, term)
        journal.ended.update(plan.ended)
        journal.restore_rules(core)
        self.gm_state[g] = "up"
        outputs = core.recover(plan.deltas, plan.running, plan.queued, now, journal.gangs, plan.replayed)
        return outputs + self._deliver_gm(g, now)

    def _deliver_gm(self, g: int, now: float) -> list[Output]:
        """Hand what waited for GM `g` to it, in arrival order."""
        waiting, self.gm_inbox[g] = self.gm_inbox[g], []
        handler = self._gm_handlers[g]
        out: list[Output] = []
        for msg in waiting:
            out.extend(handler(msg, now))
        return out

    # ------------------------------------------------------------------ LMs

    def _ask_workers(self, lm: int, now: float) -> list[Output]:
        """The workers of a restarted LM register again with the runs they hold (one hop later)."""
        assert self.agents is not None
        self.post(now + self.hop, Later(partial(self._rebuild, lm, list(self.agents[lm].runs.values()))))
        return []

    def _rebuild(self, lm: int, runs: list[Placement], now: float) -> list[Output]:
        """The next incarnation of LM `lm`, from its workers' registrations (`runs`)."""
        system = self.system
        old = system.lms[lm]
        system.retire(old)
        core = system.lms[lm] = system.new_lm(lm, (max(old.version) >> VERSION_BITS) + 1)
        dead = system.workers[lm].dead
        core.adopt(p for p in runs if p.node not in dead)
        out = core.take_down(sorted(dead), f"its worker did not register with LM {lm} again", now) if dead else []
        self.lm_state[lm] = "up"
        out += self._deliver_lm(lm, now)
        out += core.start(now)
        out += [Send(gm_address(g), runs_held(core, g)) for g in range(core.num_gms)]
        return out

    def _deliver_lm(self, lm: int, now: float) -> list[Output]:
        """Hand what waited for LM `lm` (messages and liveness changes) to it, in arrival order."""
        waiting, self.lm_inbox[lm] = self.lm_inbox[lm], []
        handler, core = self._lm_handlers[lm], self.system.lms[lm]
        out: list[Output] = []
        for msg in waiting:
            out.extend(msg.act(core, now) if type(msg) is _Deferred else handler(msg, now))
        return out
