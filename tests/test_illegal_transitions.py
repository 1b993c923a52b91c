"""Illegal task transitions under faults: a preemption request to a crashed LM fails (`GlobalMaster.call_failed`)
and counts as refused, and the task is decided again (for the next LM, or once a node frees up). No LM saw the
request, so the GM reports the refusal itself; before it did, the recorder saw DECIDED while the task was still
PLACING and counted an illegal transition (`megha replay ... --fail lm:rate=200 --job-classes low:30%,high:30%`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

from megha.common.core.gm import GlobalMaster
from megha.common.core.lifecycle import State
from megha.common.core.messages import PreemptRequest
from megha.common.core.parked import Shape
from megha.common.core.policies.preemption import PreemptionPlan
from megha.common.core.task import TaskSpec
from megha.loadgen.recorder import Recorder

from corekit import CAP, Net, cluster, job, task


class AskLms:
    """A preemption policy that asks LM `first`, then the LMs of `rest` (no victims: the test never lets the LM
    answer)."""

    name = "ask-lms"

    def __init__(self, first: int, rest: list[int]) -> None:
        self.first, self.rest = first, rest

    def plan(self, task: TaskSpec, lms: list[int] | None) -> PreemptionPlan | None:
        if lms is None:
            return PreemptionPlan(self.first, list(self.rest), [], CAP)
        return PreemptionPlan(lms[0], lms[1:], [], CAP) if lms else None

    def retry(
        self, parked: Mapping[Shape, deque[TaskSpec]], asking: set[Shape], attempt: Callable[[Shape], bool]
    ) -> None:
        return None


def full_system(rest: list[int]) -> tuple[Net, GlobalMaster, Recorder]:
    """Two LMs of one node each, both running a task of GM 0 (which asks LM 0 for a preemption, then `rest`)."""
    recorder = Recorder()
    net = Net.build(cluster([[[[]]], [[[]]]]), observer=recorder)
    gm = net.gms[0]
    for core in (*net.lms, *net.workers):
        core.observer = recorder
    gm.policies.preemption = AskLms(0, rest)
    filler = job("fill", task("fill.0", duration=5.0), task("fill.1", duration=5.0))
    recorder.expect(0, filler)
    net.post(gm.submit(filler, 0.0))
    while net.inbox:  # launch both, and their answers
        net.deliver()
    assert set(gm.running) == {"fill.0", "fill.1"}
    return net, gm, recorder


def state(recorder: Recorder, task_id: str) -> State:
    return State(recorder.states[recorder.tasks.number[task_id]])


def test_a_preemption_request_to_a_crashed_lm_is_refused_then_the_next_lm_is_asked_without_an_illegal_event() -> None:
    net, gm, recorder = full_system(rest=[1])
    waiting = job("wait", task("wait.0"))
    recorder.expect(0, waiting)
    net.post(gm.submit(waiting, 1.0))
    first = net.take("lm/0", PreemptRequest)
    assert isinstance(first, PreemptRequest) and state(recorder, "wait.0") == State.PLACING
    net.post(gm.call_failed(0, first.seq, "LM 0 is down", 1.5))  # the LM crashed: the request failed at once
    second = net.take("lm/1", PreemptRequest)  # counted as refused: the next LM is asked
    assert isinstance(second, PreemptRequest) and second.task.task_id == "wait.0"
    assert state(recorder, "wait.0") == State.PLACING
    assert recorder.illegal == 0


def test_a_parked_task_whose_preemption_request_failed_is_placed_later_without_an_illegal_event() -> None:
    net, gm, recorder = full_system(rest=[])
    waiting = job("wait", task("wait.0"))
    recorder.expect(0, waiting)
    net.post(gm.submit(waiting, 1.0))
    request = net.take("lm/0", PreemptRequest)
    assert isinstance(request, PreemptRequest)
    net.post(gm.call_failed(0, request.seq, "LM 0 is down", 1.5))  # no other LM to ask: it waits, parked
    assert state(recorder, "wait.0") == State.QUEUED
    net.run()  # the fillers finish; the parked task is placed on a freed node and runs
    assert state(recorder, "wait.0") == State.COMPLETED
    assert recorder.illegal == 0
    assert [state(recorder, t) for t in ("fill.0", "fill.1")] == [State.COMPLETED] * 2
