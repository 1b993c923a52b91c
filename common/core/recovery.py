"""Recovery after a GM or LM crash: what a restarting GM learns from the LMs, how it splits its accepted tasks into
running, queued and ended from that and from its durable records, and which runs a GM learns were lost when an LM
comes back without them. The services and the simulator both use it."""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from megha.common.core.lm import LocalMaster
from megha.common.core.messages import Completion, Completions, Delta, EndedRun, Placement, node_state
from megha.common.core.task import TaskSpec


def first_run_number(term: int) -> int:
    """The run number a GM recovering with `term` (its identity's claim at the LMs, one higher at each restart)
    queues its tasks again with: above every run number of its earlier terms, so that a copy of an earlier run's
    end never names a run of this term (a term's preemptions add one each to a task's run number, far fewer
    than 2**20)."""
    return (term << 20) + 1


@dataclass(slots=True)
class LMReport:
    """What an LM tells a (re)starting GM: every node's state (`delta`, which also gives the highest launch batch
    of that GM it applied), the GM's runs it holds (running, or being preempted: their worker's report is still
    to come), and the GM's runs that ended there recently."""

    delta: Delta
    running: list[Placement]
    ended: list[EndedRun]


def lm_report(lm: LocalMaster, gm: int) -> LMReport:
    """LM `lm`'s report to GM `gm` (the body of the services' `GET /v1/gms/{gm}/state`)."""
    return LMReport(
        lm.full_state(gm),
        [a.placement for table in (lm.running, lm.preempting) for a in table.values() if a.gm == gm],
        lm.ended_runs(gm),
    )


@dataclass(slots=True)
class Recovery:
    """How a GM rebuilds (the arguments of `GlobalMaster.recover`), and `ended`: task id -> error ("" when it
    finished) for the accepted tasks whose end the GM's own records lack but an LM remembers; the driver records
    those ends (they were announced when they happened). `replayed`: the ends LMs remember of tasks whose job has a
    retry rule, as the completions that reported them (their runs are in `running`); the GM applies them as it
    recovers, so that the rule decides again and a gang's finished member is held again until its whole attempt
    finished (docs/gang.md)."""

    deltas: list[Delta]
    running: list[Placement]
    queued: list[TaskSpec]
    ended: dict[str, str]
    replayed: list[Completions]


def plan_recovery(
    gm: int,
    accepted: Iterable[TaskSpec],
    ended: Container[str],
    reports: Sequence[LMReport],
    backlog: Iterable[object] = (),
    ruled: Container[str] = (),
    term: int = 0,
) -> Recovery:
    """Split GM `gm`'s `accepted` tasks (its durable intake, in arrival order) given the ids its records show
    `ended`, every LM's report, `backlog`: the messages that waited for the GM while it was down (its broker
    queue), to be handled, in order, once it has recovered, `ruled`: the ids of the jobs with a retry rule, and
    `term`: the GM's term (0: its tasks are queued again with the run numbers they have).

    A task an LM runs for the GM is running; one whose run a waiting completion reports is running too, on that
    LM, so that the completion then ends it through the GM's usual path (finished, lost and run again, or
    preempted and queued again); so is one of a job in `ruled` whose run an LM remembers ended, its end replayed
    (a finished run of a gang member may have been held, not reported: the GM's records do not say); one neither
    running nor ended is queued, as its run `first_run_number(term)`. Nothing running or finished is launched
    again, and no waiting completion is applied to a task launched again."""
    tasks = {t.task_id: t for t in accepted}
    open_ids = {tid for tid in tasks if tid not in ended}
    running: dict[str, Placement] = {}
    for report in reports:
        for p in report.running:
            if p.task.task_id in open_ids:
                running[p.task.task_id] = p
    # Each task's latest run an LM remembers ended, with its LM. An end of an earlier attempt than the task's is
    # stale: a failed run its job's retry rule runs again.
    remembered: dict[str, tuple[int, EndedRun]] = {}
    for report in reports:
        for run in report.ended:
            tid = run.task_id
            if tid in open_ids and run.attempt >= tasks[tid].attempt:
                known = remembered.get(tid)
                if known is None or known[1].attempt <= run.attempt:
                    remembered[tid] = (report.delta.lm, run)
    waiting: dict[str, Placement] = {}
    for msg in backlog:
        if not isinstance(msg, Completions):
            continue
        for item in msg.items:
            tid = item.task_id
            if tid not in open_ids or tid in running:
                continue
            seen = waiting.get(tid)
            if seen is None or (seen.task.attempt, seen.task.run_number) < (item.attempt, item.run_number):
                task = replace(tasks[tid], attempt=item.attempt, run_number=item.run_number)
                waiting[tid] = Placement(task, msg.lm, item.state.node, False, gm)
    running.update(waiting)
    new_ends: dict[str, str] = {}
    replayed: dict[int, list[Completion]] = {}
    for tid, (lm, run) in remembered.items():
        if tid in running:
            continue
        task = tasks[tid]
        if task.job_id not in ruled:
            new_ends[tid] = run.error
            continue
        if task.attempt != run.attempt:
            task = replace(task, attempt=run.attempt)
        running[tid] = Placement(task, lm, run.node, False, gm)
        # Version 0: the GM's view keeps the LM's own, newer state of the node.
        end = Completion(
            tid,
            node_state((run.node, (), 0)),
            run.error,
            attempt=run.attempt,
            exit_code=run.exit_code,
            run_number=task.run_number,
        )
        replayed.setdefault(lm, []).append(end)
    run_number = first_run_number(term) if term else None
    queued = [
        t if run_number is None else replace(t, run_number=run_number)
        for tid, t in tasks.items()
        if tid in open_ids and tid not in running and tid not in new_ends
    ]
    completions = [Completions(lm, gm, 0, items) for lm, items in sorted(replayed.items())]
    return Recovery([r.delta for r in reports], list(running.values()), queued, new_ends, completions)


@dataclass(slots=True)
class RunsHeld:
    """LM -> GM, from an LM rebuilt after a crash once it adopted what its workers run and applied the reports and
    launches that waited for it: the GM's runs it holds. A run the GM believes is on that LM and that is not among
    them is lost: its worker went while no LM watched it (`runs_lost`)."""

    lm: int
    gm: int
    incarnation: int
    task_ids: frozenset[str]


def runs_held(lm: LocalMaster, gm: int) -> RunsHeld:
    """What rebuilt LM `lm` tells GM `gm` it holds."""
    ids = frozenset(tid for table in (lm.running, lm.preempting) for tid, a in table.items() if a.gm == gm)
    return RunsHeld(lm.lm_id, gm, lm.incarnation, ids)


def runs_lost(running: Mapping[str, Placement], held: RunsHeld) -> Completions | None:
    """The runs of a GM's `running` table on `held.lm` that the rebuilt LM does not hold, as completions of lost
    runs (the GM runs each again as its next attempt, or fails it after its last); None when there is none.
    Every report the LM sent before `held` has arrived (one queue per GM), so a run that ended is not in
    `running` any more. Their node states carry version 0: the GM's view keeps the LM's own, newer ones."""
    reason = f"LM {held.lm} restarted (incarnation {held.incarnation}) without this run: its worker was lost"
    return lost_runs(running, held.lm, held.gm, reason, held.task_ids)


def lost_runs(
    running: Mapping[str, Placement], lm: int, gm: int, reason: str, kept: frozenset[str] = frozenset()
) -> Completions | None:
    """The runs of a GM's `running` table on LM `lm`, but those in `kept`, as completions of lost runs with
    `reason` (None when there is none). Their node states carry version 0: the GM's view keeps the LM's own."""
    items = [
        Completion(
            tid, node_state((p.node, (), 0)), reason, lost=True, attempt=p.task.attempt, run_number=p.task.run_number
        )
        for tid, p in running.items()
        if p.lm == lm and tid not in kept
    ]
    return Completions(lm, gm, 0, items) if items else None
