"""Progress of long runs: on a terminal a bar with the share done and the time left; nothing more on a pipe."""

from __future__ import annotations

import io
import re
import time

import pytest

from megha.cli import main
from megha.loadgen.progress import Progress
from megha.loadgen.replay import ReplayConfig
from megha.sim.experiments import harness

from servicekit import wait_until

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def shown(stream: io.StringIO) -> str:
    return ANSI.sub("", stream.getvalue())


def test_a_bar_shows_the_share_done_and_the_time_left() -> None:
    stream = Terminal()
    progress = Progress(stream)
    assert progress.bar
    with progress.track("replaying", 1000, "tasks") as advance:
        for done in (100, 400, 700):
            advance(done, "t=12 s")
            time.sleep(0.05)  # a pace: the time left is estimated from it
    text = shown(stream)
    assert "replaying" in text and "700/1,000 tasks" in text and "t=12 s" in text
    assert re.search(r"\d+:\d\d:\d\d left", text), text


def test_no_bar_off_a_terminal() -> None:
    stream = io.StringIO()
    progress = Progress(stream)
    assert not progress.bar
    with progress.track("replaying", 1000, "tasks") as advance:
        advance(500, "")
    progress.note("a note")
    assert stream.getvalue() == "a note\n"


def test_a_replay_on_a_terminal_shows_a_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    harness.run_replay(ReplayConfig(trace="syn:50:40", lms=1, gms=2, workers_per_partition=30), "syn:50:40")
    text = shown(terminal)
    assert "replaying 40 jobs (2,000 tasks)" in text
    assert "/2,000 tasks" in text and "left" in text


def test_quiet_and_piped_replays_print_no_progress(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["replay", "--trace", "syn:10:5", "--lms", "1", "--gms", "2", "--workers-per-partition", "10"]
    argv += ["--no-constraints", "--no-files"]
    assert main([*argv, "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert main(argv) == 0  # stderr is not a terminal here: one line saying what runs, and no bar
    assert capsys.readouterr().err.count("\n") == 1


def test_a_bar_s_whole_can_grow_and_notes_while_it_shows_are_kept() -> None:
    stream = Terminal()
    progress = Progress(stream)
    with progress.track("replaying", 10, "tasks") as advance:
        advance(4, "", 10)
        wait_until(lambda: "4/10 tasks" in shown(stream), 5, lambda: shown(stream))  # the bar is drawn
        progress.note("submitted; waiting for 30 tasks")
        advance(25, "3/3 jobs submitted", 30)
        wait_until(lambda: "25/30 tasks" in shown(stream), 5, lambda: shown(stream))
    text = shown(stream)
    assert "submitted; waiting for 30 tasks\n" in text
    assert "25/30 tasks" in text and "3/3 jobs submitted" in text, text
