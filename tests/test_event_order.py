"""The in-memory transport's order among events due at the same virtual time (`--event-order`): FIFO by default,
or a random order drawn with a seed, as the constraint-aware paper's simulator leaves it undefined."""

from __future__ import annotations

from dataclasses import replace

import pytest

from megha.cli import main
from megha.common.core.messages import DeltaTick, Send
from megha.common.transport.inmemory import EventLoop
from megha.loadgen.replay import ReplayConfig, replay


def _delivered(ties_seed: int | None) -> list[tuple[float, int]]:
    """Messages 0-19 sent at once to one endpoint and 20-39 to another, then one a second later: as delivered."""
    loop = EventLoop(hop_delay=0.5, ties_seed=ties_seed)
    got: list[tuple[float, int]] = []
    loop.register("a", lambda msg, now: got.append((now, msg)) or [])  # type: ignore[func-returns-value]
    loop.register("b", lambda msg, now: got.append((now, msg)) or [])  # type: ignore[func-returns-value]
    loop.register("start", lambda msg, now: [Send("a" if k < 20 else "b", k) for k in range(40)])
    loop.post(1.0, "start", DeltaTick())
    loop.post(2.0, "a", 40)
    loop.run(lambda: False)
    return got


def test_fifo_delivers_equal_times_in_sending_order_and_a_seeded_order_shuffles_only_them() -> None:
    assert _delivered(None) == [(1.5, k) for k in range(40)] + [(2.0, 40)]
    seeded = _delivered(7)
    assert seeded == _delivered(7)  # the same seed, the same order
    assert seeded != _delivered(8)
    assert [at for at, _ in seeded] == [1.5] * 40 + [2.0]  # time order kept
    assert sorted(k for _, k in seeded[:40]) == list(range(40)) and [k for _, k in seeded[:40]] != list(range(40))


# 1 s tasks arriving on whole seconds (many events at equal times) on 36 workers, for 40 at a time
SMALL = ReplayConfig(trace="syn:40:30", lms=2, gms=3, workers_per_partition=6, constraints=False)


def test_a_replay_under_a_seeded_order_loses_nothing_repeats_itself_and_differs_from_fifo() -> None:
    fifo = replay(SMALL)
    seeded = replay(replace(SMALL, event_order="seeded"))
    again = replay(replace(SMALL, event_order="seeded"))
    for result in (fifo, seeded):
        assert result.metrics.not_exactly_once == ()
        assert result.metrics.tasks_completed == result.metrics.tasks == 1200
        assert all(lm.is_idle() for lm in result.system.lms)
    order = [
        [(t.task_id, t.lm, t.node, t.started_at) for t in r.recorder.tasks.values()] for r in (fifo, seeded, again)
    ]
    assert order[1] == order[2]
    assert order[0] != order[1]


def test_an_unknown_event_order_is_refused_naming_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=r"unknown event order 'lifo'; choose one of \['fifo', 'seeded'\]"):
        replay(replace(SMALL, event_order="lifo"))
    with pytest.raises(SystemExit) as exc:
        main(["replay", "--event-order", "lifo"])
    assert exc.value.code == 2 and "--event-order: invalid choice: 'lifo'" in capsys.readouterr().err
