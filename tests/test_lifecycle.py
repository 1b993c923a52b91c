"""The task lifecycle (common/core/lifecycle.py): one table of transitions, no-ops once a task ended, and an error
naming the task and both the state and the event for anything else."""

from __future__ import annotations

import pytest

from megha.common.core.lifecycle import (
    NO_OPS,
    TERMINAL,
    TRANSITIONS,
    Event,
    IllegalTransition,
    Lifecycle,
    State,
    next_state,
)


def test_a_task_runs_through_its_states_and_ends_once() -> None:
    life = Lifecycle()
    path = [Event.ARRIVED, Event.DECIDED, Event.STARTED, Event.FINISHED]
    assert [life.advance("t", e) for e in path] == [True] * 4
    assert life.state("t") is State.COMPLETED
    assert life.advance("t", Event.FINISHED) is False  # a duplicate completion
    assert life.state("t") is State.COMPLETED


@pytest.mark.parametrize("event", [Event.PREEMPTED, Event.LOST])
def test_a_preempted_or_lost_task_is_queued_for_its_next_run(event: Event) -> None:
    life = Lifecycle()
    for e in (Event.ARRIVED, Event.DECIDED, Event.STARTED, event, Event.DECIDED, Event.STARTED, Event.FINISHED):
        assert life.advance("t", e)
    assert life.state("t") is State.COMPLETED


def test_an_inconsistency_sends_the_placement_back_to_the_queue() -> None:
    life = Lifecycle()
    for e in (Event.ARRIVED, Event.DECIDED, Event.REFUSED):
        life.advance("t", e)
    assert life.state("t") is State.QUEUED


@pytest.mark.parametrize("first", [Event.FINISHED, Event.FAILED, Event.CANCELLED])
@pytest.mark.parametrize("late", [Event.FINISHED, Event.FAILED, Event.CANCELLED, Event.STARTED, Event.LOST])
def test_the_first_end_wins_and_later_news_is_a_no_op(first: Event, late: Event) -> None:
    life = Lifecycle()
    for e in (Event.ARRIVED, Event.DECIDED, first):
        life.advance("t", e)
    ended = life.state("t")
    assert life.advance("t", late) is False
    assert life.state("t") is ended


@pytest.mark.parametrize(
    ("events", "state", "event"),
    [
        ((), State.NEW, Event.FINISHED),  # news of a task that never arrived
        ((Event.ARRIVED,), State.QUEUED, Event.ARRIVED),
        ((Event.ARRIVED, Event.DECIDED), State.PLACING, Event.DECIDED),  # placed twice
        ((Event.ARRIVED, Event.CANCELLED), State.CANCELLED, Event.DECIDED),  # placed after its job was cancelled
        ((Event.ARRIVED,), State.QUEUED, Event.REFUSED),
    ],
)
def test_an_illegal_event_names_the_task_its_state_and_the_event(
    events: tuple[Event, ...], state: State, event: Event
) -> None:
    life = Lifecycle()
    for e in events:
        life.advance("job-1.3", e)
    with pytest.raises(IllegalTransition, match=f"task job-1.3: {event.name} is not allowed in state {state.name}"):
        life.advance("job-1.3", event)
    assert life.state("job-1.3") is state


def test_the_table_never_moves_a_task_out_of_an_end_and_names_each_pair_once() -> None:
    assert not {state for state, _ in TRANSITIONS} & TERMINAL
    assert not set(TRANSITIONS) & NO_OPS
    assert all(state in TERMINAL for state, _ in NO_OPS)


def test_the_flat_lookup_agrees_with_the_table() -> None:
    for state in State:
        for event in Event:
            if (state, event) in TRANSITIONS:
                assert next_state("t", state, event) == TRANSITIONS[state, event]
            elif (state, event) in NO_OPS:
                assert next_state("t", state, event) == -1
            else:
                with pytest.raises(IllegalTransition):
                    next_state("t", state, event)


def test_a_forgotten_task_is_new_again() -> None:
    life = Lifecycle()
    life.advance("t", Event.ARRIVED)
    life.forget("t")
    assert life.state("t") is State.NEW and life.states == {}
