"""A task's lifecycle: its states, the events that move it (the observer events of `observer.py`), and every legal
transition in one table, as h11's `_state.py` keeps a connection's.

    NEW --ARRIVED--> QUEUED --DECIDED--> PLACING --STARTED--> RUNNING --FINISHED--> COMPLETED
                       ^                    |                   |      --FAILED----> FAILED
                       +----- REFUSED ------+                   |      --CANCELLED-> CANCELLED
                       +-- PREEMPTED, LOST (its next attempt) --+
                       +-- RETRIED (its next attempt, after a backoff; common/core/retry.py)

A task ends exactly once: the first end (FINISHED, FAILED, CANCELLED) wins, and any later end, or later news of a
run (a start, a loss, a preemption, an LM's refusal), is a no-op: `advance` answers False. Such news is a race, not
a bug: a cancel crosses a completion, a start report arrives after its run's end report (the worker agent and the
LM publish apart), a GM gives up on an LM that later reports the run. Anything else the table does not name (a
task placed twice, placed after it ended, an event before its arrival) is an `IllegalTransition`.

Observers that see only some events move along the edges they see: the load generator sees no decisions
(QUEUED --STARTED--> RUNNING), a GM sees no starts (PLACING --FINISHED--> COMPLETED).

Sans-I/O and cheap: a state is a small int, and a transition one list lookup.
"""

from __future__ import annotations

from enum import IntEnum


class State(IntEnum):
    """Where a task is in its lifecycle."""

    NEW = 0  # not yet arrived at its GM
    QUEUED = 1  # waiting at its GM (submitted, or back for its next run)
    PLACING = 2  # its GM decided a node; the placement is on its way to the LM and the worker
    RUNNING = 3  # its worker started it
    COMPLETED = 4  # it finished
    FAILED = 5  # it failed (with a reason), or its job was rejected
    CANCELLED = 6  # its job was cancelled


class Event(IntEnum):
    """What happens to a task: the observer events (`CoreObserver`) that move it, each named after its method."""

    ARRIVED = 0  # job_arrived
    DECIDED = 1  # decided
    REFUSED = 2  # inconsistency (the GM's view was stale), preemption_refused: the LM refused the placement
    STARTED = 3  # started
    PREEMPTED = 4  # preempted, task_preempted: stopped for another user's task; it runs again
    LOST = 5  # task_lost: its worker was lost; it runs again as its next attempt
    FINISHED = 6  # finished, task_completed without an error
    FAILED = 7  # task_failed, task_completed with an error, job_rejected
    CANCELLED = 8  # task_cancelled
    RETRIED = 9  # task_retry_scheduled: its run failed and its job's retry rule runs it again after a backoff


TERMINAL: frozenset[State] = frozenset({State.COMPLETED, State.FAILED, State.CANCELLED})
"""The states a task ends in."""

_ENDS = (Event.FINISHED, Event.FAILED, Event.CANCELLED)
_NEWS_OF_A_RUN = (Event.REFUSED, Event.STARTED, Event.PREEMPTED, Event.LOST, Event.RETRIED)
_UNENDED = (State.QUEUED, State.PLACING, State.RUNNING)

TRANSITIONS: dict[tuple[State, Event], State] = {
    (State.NEW, Event.ARRIVED): State.QUEUED,
    (State.NEW, Event.FAILED): State.FAILED,  # its job was rejected at submission
    (State.QUEUED, Event.DECIDED): State.PLACING,
    (State.QUEUED, Event.STARTED): State.RUNNING,  # an observer that sees no decisions
    (State.PLACING, Event.STARTED): State.RUNNING,
    (State.PLACING, Event.REFUSED): State.QUEUED,
    (State.PLACING, Event.PREEMPTED): State.QUEUED,  # a GM sees no starts
    (State.PLACING, Event.LOST): State.QUEUED,
    (State.RUNNING, Event.PREEMPTED): State.QUEUED,
    (State.RUNNING, Event.LOST): State.QUEUED,
    (State.PLACING, Event.RETRIED): State.QUEUED,  # a GM sees no starts
    (State.RUNNING, Event.RETRIED): State.QUEUED,
    **{(state, Event.FINISHED): State.COMPLETED for state in _UNENDED},
    **{(state, Event.FAILED): State.FAILED for state in _UNENDED},
    **{(state, Event.CANCELLED): State.CANCELLED for state in _UNENDED},
}
"""Every transition that moves a task: (state, event) -> its next state."""

NO_OPS: frozenset[tuple[State, Event]] = frozenset(
    (state, event) for state in TERMINAL for event in (*_ENDS, *_NEWS_OF_A_RUN)
)
"""(state, event) pairs that leave the task as it is: any end, or news of a run, once the task has ended."""


class IllegalTransition(ValueError):
    """An event the lifecycle does not allow in the task's state."""

    def __init__(self, task_id: str, state: State, event: Event) -> None:
        super().__init__(f"task {task_id}: {event.name} is not allowed in state {state.name}")
        self.task_id = task_id
        self.state = state
        self.event = event


NO_OP = -1
"""What `next_state` answers for an event that leaves the task as it is."""

ILLEGAL = -2
"""What `STEPS` holds for an event the lifecycle does not allow."""

STEPS: tuple[int, ...] = tuple(
    TRANSITIONS.get((state, event), NO_OP if (state, event) in NO_OPS else ILLEGAL)
    for state in State
    for event in Event
)
"""The table flattened for a caller's hot loop: `STEPS[state * len(Event) + event]` is the next state, `NO_OP` or
`ILLEGAL` (then `next_state` raises the error to report)."""

_WIDTH = len(Event)


def next_state(task_id: str, state: int, event: int) -> int:
    """The state `event` moves a task in `state` to; `NO_OP` when it leaves it as it is. Raises `IllegalTransition`.
    For callers that keep the state in a column of their own (the load generator's records, the GM's job table)."""
    after = STEPS[state * _WIDTH + event]
    if after == ILLEGAL:
        raise IllegalTransition(task_id, State(state), Event(event))
    return after


class Lifecycle:
    """The states of many tasks, in one dict of small ints. A task it has not seen is NEW; `forget` a task that
    ended to bound it."""

    __slots__ = ("states",)

    def __init__(self) -> None:
        self.states: dict[str, int] = {}  # task id -> State

    def advance(self, task_id: str, event: Event) -> bool:
        """Move the task along `event`: True when its state changed (or it went back to QUEUED), False for a no-op
        (see `NO_OPS`). Raises `IllegalTransition`, naming the task, its state and the event."""
        after = next_state(task_id, self.states.get(task_id, State.NEW), event)
        if after == NO_OP:
            return False
        self.states[task_id] = after
        return True

    def state(self, task_id: str) -> State:
        return State(self.states.get(task_id, State.NEW))

    def forget(self, task_id: str) -> None:
        self.states.pop(task_id, None)
