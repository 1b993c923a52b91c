"""Worker membership and liveness decisions (`megha.common.core.liveness`), without I/O."""

from __future__ import annotations

from megha.common.core.liveness import Heard, WorkerLiveness


def test_a_silent_member_is_a_suspect_once_past_the_timeout_and_kept_when_it_answers() -> None:
    live = WorkerLiveness(timeout=10.0)
    live.joined("w0", 0.0)
    live.joined("w1", 5.0)
    assert live.suspects(10.0) == []  # not more than the timeout yet
    assert live.suspects(12.0) == [("w0", 12.0)]
    live.answered("w0", 12.0)  # its health check answered: only its heartbeats are late
    assert live.suspects(16.0) == [("w1", 11.0)]
    assert live.heard("w1", running=2, now=16.0) is Heard.NOTHING
    assert live.suspects(16.0) == []


def test_a_lost_member_is_asked_once_to_stop_its_lost_tasks_and_is_back_when_it_runs_nothing() -> None:
    live = WorkerLiveness(timeout=10.0)
    live.joined("w0", 0.0)
    assert live.suspects(11.0) == [("w0", 11.0)]
    worker = "w0"
    live.taken_down(worker, ["j.0", "j.1"])
    assert live.suspects(30.0) == []  # a lost agent is not taken down again
    # It was cut off, not dead: heard again while still running them, it is asked to stop them, once a round.
    assert live.heard("w0", running=2, now=31.0) is Heard.STOP_LOST
    assert live.heard("w0", running=2, now=32.0) is Heard.NOTHING
    live.asked_to_stop("w0")
    assert live.heard("w0", running=1, now=33.0) is Heard.STOP_LOST
    assert live.heard("w0", running=0, now=34.0) is Heard.BRING_BACK
    live.brought_back("w0")
    assert live.lost == {} and live.stopping == set()
    assert live.heard("w0", running=0, now=35.0) is Heard.NOTHING


def test_a_restarted_agent_registering_again_is_alive() -> None:
    live = WorkerLiveness(timeout=10.0)
    live.joined("w0", 0.0)
    live.joined("w0", 20.0)  # registered again after a restart
    assert live.suspects(25.0) == []
