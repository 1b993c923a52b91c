"""The ids of the jobs a GM identity accepts (`JobIds`): made so that they never repeat, and found again by the name
a user gave its job."""

from __future__ import annotations

import itertools
from collections.abc import Container, Iterable

from megha.common.models import JOB_SCOPE


class JobIds:
    """The ids of the jobs a GM identity accepts, which never repeat, so that no two jobs of the federation, nor
    their tasks' runs at the LMs and agents, nor their records in a journal, share one.

    A job submitted without an id gets `g<gm>-<start>-<n>`: `n` counts from 0 and `start` is the time of the first
    such id this process made for the identity, in base-36 unix milliseconds, raised above the start of every id
    the job table holds (recovered from the journal; a start of more than 9 digits, past the year 5000, is not a
    GM's). A GM that restarts, with its journal or without, and a peer that stands in for it start at a later
    millisecond than the holder before. A job a user names gets `<user>~<name>~<such an id>`: the name in the
    user's scope, made unique, so that a name used again (at another GM, or once the GM forgot the job) is another
    job's. While the GM holds a job of that name, the name finds it (`resolve`) and another job may not take it.
    Letters, digits and `_ . - @ ~` only: safe in URLs, file names and task ids."""

    def __init__(self, gm: int, held: Iterable[str], now: float) -> None:
        """`held`: the job ids the identity's job table holds; `now`: unix seconds."""
        prefix = f"g{gm}-"
        start = int(now * 1000)
        self._names: dict[str, str] = {}  # the scoped name of a held user-named job -> its id
        for job_id in held:
            parts = job_id.split(JOB_SCOPE)
            if len(parts) == 3:  # <user>~<name>~<made>
                self._names[JOB_SCOPE.join(parts[:2])] = job_id
            elif len(parts) != 1:
                continue
            made = parts[-1]
            stamp, dash, _ = made.removeprefix(prefix).partition("-")
            if made.startswith(prefix) and dash and len(stamp) <= 9 and stamp.isascii() and stamp.isalnum():
                start = max(start, int(stamp, 36) + 1)
        self.prefix = f"{prefix}{_base36(start)}-"
        self._numbers = itertools.count()

    def next(self, taken: Container[str]) -> str:
        """A fresh id, not in `taken` (an operator may have chosen one like it)."""
        while (job_id := f"{self.prefix}{next(self._numbers)}") in taken:
            pass
        return job_id

    def resolve(self, name: str, held: Container[str]) -> str | None:
        """The id of the held job a user named `name` (`<user>~<name>`), if any."""
        job_id = self._names.get(name)
        if job_id is not None and job_id not in held:
            del self._names[name]  # forgotten: the name is free again
            return None
        return job_id

    def named(self, name: str, held: Container[str]) -> str:
        """A fresh id for a job a user names `name` (`<user>~<name>`); ValueError while a held job has it."""
        if (holder := self.resolve(name, held)) is not None:
            raise ValueError(f"job {name} already exists ({holder})")
        return f"{name}{JOB_SCOPE}{self.next(held)}"

    def accepted(self, job_id: str) -> None:
        """Job `job_id` was accepted: a user-named one is found by its name from now on."""
        name, _, _ = job_id.rpartition(JOB_SCOPE)
        if JOB_SCOPE in name:
            self._names[name] = job_id


def _base36(n: int) -> str:
    digits = ""
    while True:
        n, d = divmod(n, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[d] + digits
        if not n:
            return digits
