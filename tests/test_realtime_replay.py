"""`megha replay --realtime`: a run on the wall clock ends when its work does, not at the next crash or repair of
its fault process, and its progress bar moves as tasks end."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest

from megha.common.transport import inmemory
from megha.embedded.faults import Fault, Faults
from megha.loadgen.progress import Advance, Progress
from megha.loadgen.replay import ReplayConfig, replay

# Two jobs of three tasks on four nodes, all ended by 0.21 s without faults (a tenth of the synthetic trace's time).
TINY = ReplayConfig(
    trace="syn:3:2", time_scale=0.1, lms=1, gms=1, workers_per_partition=4, constraints=False, realtime=True
)


class FakeClock:
    """The event loop's `time`: `sleep` moves `monotonic` on at once, so a real-time run takes no real time and
    `now` ends as the latest event time the run waited for."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(inmemory, "time", fake)
    return fake


def _last_task_end(config: ReplayConfig) -> float:
    """When the last task of `config`'s run ends, on the virtual clock."""
    records = replay(replace(config, realtime=False)).recorder.tasks.values()
    return max(rec.finished_at for rec in records)


def test_a_realtime_run_ends_when_its_tasks_end_not_at_the_repair_of_a_crashed_worker() -> None:
    faults = Faults(at=(Fault("worker", 0.05, 0, 0),), detect=0.1)  # the node is repaired 60 s after the crash
    result = replay(replace(TINY, faults=faults))
    assert result.metrics.tasks_completed == result.metrics.tasks == 6
    assert result.system.counters()["worker_crashes"] == 1
    assert result.wall_seconds < 30  # it waited for the repair at 60.05 s


@pytest.mark.parametrize(
    "faults",
    [
        Faults(at=(Fault("worker", 0.05, 0, 0),), detect=0.1),  # its repair at 60.05 s
        Faults(gm_rate=1),  # the next GM crash drawn an hour away on average, then its restart
        Faults(lm_rate=1),
        Faults(worker_rate=5, detect=0.5, repair=1),
        Faults(at=(Fault("gm", 2.0, 0, down=40),)),  # a GM crash after the last task, and its restart
        Faults(at=(Fault("lm", 2.0, 0, down=40, partition=True),)),
    ],
    ids=["worker-at", "gm-rate", "lm-rate", "worker-rate", "gm-after-the-end", "partition-after-the-end"],
)
def test_a_realtime_run_does_not_wait_for_crashes_and_repairs_after_its_last_task(
    clock: FakeClock, faults: Faults
) -> None:
    config = replace(TINY, faults=faults)
    end = _last_task_end(config)
    result = replay(config)
    assert result.metrics.tasks_completed == 6
    assert clock.now <= end + 1.0  # it waited for the last task's end, and a delta round at most
    # The faults after the last task are still struck, without waiting: the same as on the virtual clock.
    assert result.system.counters() == replay(replace(config, realtime=False)).system.counters()


@pytest.mark.parametrize(
    "fault",
    [
        Fault("gm", 0.1, 0, down=5),  # completions wait for the GM's restart
        Fault("gm", 0.0, 0, down=5),  # the jobs wait for the GM's restart, held by no core meanwhile
    ],
    ids=["gm-holding-tasks", "gm-holding-jobs"],
)
def test_a_realtime_run_waits_for_a_restart_that_work_waits_for(clock: FakeClock, fault: Fault) -> None:
    config = replace(TINY, faults=Faults(at=(fault,)))
    end = _last_task_end(config)
    assert end > 5
    result = replay(config)
    assert result.metrics.tasks_completed == 6
    assert clock.now == pytest.approx(end, abs=1.0)


class RecordingProgress(Progress):
    """A progress with a bar whose `advance` calls are kept."""

    def __init__(self) -> None:
        super().__init__(bar=True)
        self.done: list[int] = []

    @contextmanager
    def track(self, description: str, total: int, unit: str) -> Iterator[Advance]:
        def advance(done: int, detail: str, total: int | None = None) -> None:
            self.done.append(done)

        yield advance

    def note(self, line: str) -> None:
        pass


def test_the_progress_bar_of_a_realtime_run_moves_as_tasks_end(clock: FakeClock) -> None:
    progress = RecordingProgress()
    replay(TINY, progress)
    assert progress.done == sorted(progress.done)
    assert progress.done[-1] == 6
    assert len(set(progress.done)) > 2  # it moved on the way, not only at the end
