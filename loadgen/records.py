"""Per-task and per-job measurement records, filled while a replay runs and read by the report: one `TaskRecord`
per task, kept as columns (`TaskColumns`), and one `JobRecord` per job."""

from __future__ import annotations

import dataclasses
import math
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from megha.common.core.task import TaskSpec

NAN = math.nan


@dataclass(slots=True)
class TaskRecord:
    """Everything measured about one task. Times are seconds on the run's clock; NaN means "did not happen".

    Allocation time (Megha paper, section III) = started_at - arrival, split into
    framework queuing (attempt_at - arrival), processing ((decided_at - attempt_at) + (launched_at - lm_received_at)),
    communication ((lm_received_at - decided_at) + (worker_received_at - launched_at)) and
    worker queuing (started_at - worker_received_at).

    A task placed more than once keeps the stamps of its last placement, `attempt_at` to `started_at` (a placement's
    stamps replace those of the one before), so the four add up to allocation time, and earlier placements, their
    runs and the waits between them count in framework queuing (docs/report.md).
    """

    task_id: str
    job_id: str
    gm: int
    user: str
    duration: float
    request: tuple[int, ...]
    arrival: float = NAN  # inserted into the GM's request queue
    attempt_at: float = NAN  # start of the GM's scheduling attempt that made the last placement
    decided_at: float = NAN  # GM sent the placement to the LM
    lm_received_at: float = NAN
    launched_at: float = NAN  # LM validated the placement and sent it to the worker
    worker_received_at: float = NAN
    started_at: float = NAN
    finished_at: float = NAN
    attempts: int = 0  # scheduling attempts at the GM (1 when placed at once; a decision it reported none for: 1)
    reschedules: int = 0  # times the task went to the back of the GM's queue because nothing fitted
    inconsistencies: int = 0  # placements the LM rejected because the GM's view was stale
    repartitioned: bool = False
    lm: int = -1
    node: int = -1  # LM-local physical node index
    completions: int = 0  # how many times the task finished (must end at exactly 1)
    failed_reason: str = ""
    preemption_attempts: int = 0  # preemption requests its GM sent to make room for it
    preemptions: int = 0  # times it was stopped to make room for another user's task (then ran again)
    lost_cpu_seconds: float = 0.0  # CPU-seconds of work thrown away by those preemptions
    retries: int = 0  # times it ran again because its worker was lost

    @property
    def allocation_time(self) -> float:
        return self.started_at - self.arrival

    @property
    def framework_queuing(self) -> float:
        return self.attempt_at - self.arrival

    @property
    def processing(self) -> float:
        return (self.decided_at - self.attempt_at) + (self.launched_at - self.lm_received_at)

    @property
    def communication(self) -> float:
        return (self.lm_received_at - self.decided_at) + (self.worker_received_at - self.launched_at)

    @property
    def worker_queuing(self) -> float:
        return self.started_at - self.worker_received_at


@dataclass(slots=True)
class JobRecord:
    """One job. JRT delay (constraint-aware paper, eq. 1) = actual JRT - ideal JRT, ideal = the longest task.

    A job some of whose tasks its GM dropped at submission (`--unsatisfiable drop`: no node could ever run them;
    they failed) runs without them, as in the authors' simulator: it finishes with the last of its other tasks, and
    its ideal JRT is the longest of those. One whose every task was dropped never runs: `rejected_reason` says why.
    """

    job_id: str
    gm: int
    submitted_at: float
    num_tasks: int  # its tasks in the trace
    ideal_jrt: float
    finished_tasks: int = 0
    finished_at: float = NAN
    rejected_reason: str = ""  # why it never ran: its GM refused it at submission, or dropped its every task
    dropped_tasks: int = 0  # tasks its GM dropped at submission (they failed)

    def task_finished(self, at: float) -> None:
        """One more of its tasks finished, at `at`: the job finishes with its last."""
        self.finished_tasks += 1
        if self.finished_tasks == self.num_tasks - self.dropped_tasks:
            self.finished_at = at

    @property
    def jrt(self) -> float:
        return self.finished_at - self.submitted_at

    @property
    def jrt_delay(self) -> float:
        return self.jrt - self.ideal_jrt


_TASK_FIELDS = dataclasses.fields(TaskRecord)
_COLUMN_TYPES = {"float": "d", "int": "i"}  # array typecodes; a bool is a byte, a str or a request a list item


class TaskColumns(Mapping[str, TaskRecord]):
    """The task records of a run as columns: row `number[task_id]` of each column is one task, in the order the
    tasks were added. A time is a float64 in an array (NaN: did not happen), a count an int32, a flag a byte; ids,
    users, requests and failure reasons are references to strings and tuples the workload holds anyway. About 170
    bytes a task, where a `TaskRecord` object with its boxed floats and its dict entry costs about 600.

    Read as a mapping, it answers a task id with a `TaskRow`: its row, read and written as a `TaskRecord` is;
    `array` and `column` give whole columns for the metrics and the report."""

    def __init__(self) -> None:
        self.number: dict[str, int] = {}  # task id -> row
        self.columns: dict[str, Any] = {
            f.name: array(_COLUMN_TYPES[f.type]) if f.type in _COLUMN_TYPES else bytearray() if f.type == "bool" else []
            for f in _TASK_FIELDS
        }
        # Each column after the six given, and what `add_job` extends it with: its default, as a one-item array for
        # an array column (an array repeated and appended from an array is copied in C; from a list, each item
        # would be converted on its own).
        self._defaults: list[tuple[Any, Any]] = []
        for f in _TASK_FIELDS[6:]:
            column = self.columns[f.name]
            default = array(column.typecode, [f.default]) if isinstance(column, array) else [f.default]
            self._defaults.append((column, default))

    @classmethod
    def of(cls, tasks: Sequence[TaskRecord] | TaskColumns) -> TaskColumns:
        """`tasks` as columns (as they are when they already are)."""
        if isinstance(tasks, TaskColumns):
            return tasks
        table = cls()
        for f in _TASK_FIELDS:
            table.columns[f.name].extend(map(attrgetter(f.name), tasks))
        table.number = {rec.task_id: row for row, rec in enumerate(tasks)}
        return table

    def add_job(self, job_id: str, gm: int, tasks: Sequence[TaskSpec]) -> None:
        """A row for each of job `job_id`'s tasks (submitted to GM `gm`), every measurement at its default."""
        c = self.columns
        first, n = len(self), len(tasks)
        self.number.update(zip(map(attrgetter("task_id"), tasks), range(first, first + n)))
        c["job_id"].extend([job_id] * n)
        c["gm"].extend([gm] * n)
        for name in ("task_id", "user", "duration", "request"):
            c[name].extend(map(attrgetter(name), tasks))
        for column, default in self._defaults:
            column.extend(default * n)

    def set(self, task_id: str, **values: object) -> None:
        """Set fields of a task's row by name."""
        row = self.number[task_id]
        for name, value in values.items():
            self.columns[name][row] = value

    def array(self, name: str, dtype: type[np.generic]) -> np.ndarray:
        """A column as a numpy array (a copy)."""
        return np.array(self.columns[name], dtype=dtype)

    def column(self, name: str) -> list[Any]:
        """A column as a list of Python values of its field's type."""
        column = self.columns[name]
        return list(map(bool, column)) if isinstance(column, bytearray) else list(column)

    def __getitem__(self, task_id: str) -> TaskRow:
        return TaskRow(self.columns, self.number[task_id])

    def __iter__(self) -> Iterator[str]:
        return iter(self.number)

    def __len__(self) -> int:
        return len(self.columns["task_id"])  # rows: as many as ids in a run, whose ids are unique


class TaskRow:
    """One task's row of a `TaskColumns`, read and written by the field names of a `TaskRecord`, with its derived
    times (`allocation_time` and its components)."""

    __slots__ = ("_columns", "_row")

    def __init__(self, columns: dict[str, Any], row: int) -> None:
        self._columns = columns
        self._row = row

    allocation_time = TaskRecord.allocation_time
    framework_queuing = TaskRecord.framework_queuing
    processing = TaskRecord.processing
    communication = TaskRecord.communication
    worker_queuing = TaskRecord.worker_queuing

    def __repr__(self) -> str:
        return f"TaskRow({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in _TASK_FIELDS)})"


def _field(name: str, kind: str) -> property:
    def get(self: TaskRow) -> Any:
        value = self._columns[name][self._row]
        return bool(value) if kind == "bool" else value

    def put(self: TaskRow, value: Any) -> None:
        self._columns[name][self._row] = value

    return property(get, put)


for _f in _TASK_FIELDS:
    setattr(TaskRow, _f.name, _field(_f.name, str(_f.type)))
del _f
