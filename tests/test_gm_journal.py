"""The GM's write-ahead journal: what is appended is replayed, a damaged tail is skipped, a rewrite keeps only
what it is given."""

from __future__ import annotations

import asyncio
from pathlib import Path

from megha.services.gm.journal import Journal


def test_records_are_replayed_and_a_line_cut_short_by_a_crash_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "j" / "run.gm-0.journal"
    journal = Journal(path)

    async def write() -> None:
        await asyncio.gather(
            journal.append_durably({"job": {"job_id": "a", "tasks": []}, "at": 1.0}),
            journal.append_durably({"job": {"job_id": "b", "tasks": []}, "at": 2.0}),
        )

    asyncio.run(write())
    journal.append({"end": "a.0", "state": "finished", "reason": ""})
    journal.append({"end": "b.0", "state": "failed", "reason": "LM 1 unreachable"})
    journal.close()
    with path.open("ab") as f:
        f.write(b'{"job": {"job_id": "c"')  # the crash came in the middle of a write
    replayed = Journal.replay(path)
    assert [(r["job_id"], at) for r, at in replayed.jobs] == [("a", 1.0), ("b", 2.0)]
    assert replayed.ends == {"a.0": ("finished", ""), "b.0": ("failed", "LM 1 unreachable")}
    assert replayed.damaged == 1


def test_a_rewrite_keeps_only_the_records_given_and_appends_after_them(tmp_path: Path) -> None:
    path = tmp_path / "run.gm-1.journal"
    journal = Journal(path)
    journal.append({"end": "old.0", "state": "finished", "reason": ""})
    journal.rewrite([{"job": {"job_id": "kept"}, "at": 5.0}])
    journal.append({"end": "kept.0", "state": "finished", "reason": ""})
    journal.close()
    replayed = Journal.replay(path)
    assert [r["job_id"] for r, _ in replayed.jobs] == ["kept"] and replayed.ends == {"kept.0": ("finished", "")}


def test_a_missing_journal_replays_as_empty(tmp_path: Path) -> None:
    replayed = Journal.replay(tmp_path / "none.journal")
    assert (replayed.jobs, replayed.ends, replayed.damaged) == ([], {}, 0)
