"""`megha local`: its options reach the deployment it starts; on a terminal it shows a progress bar with the time
left, and its report gives wall-clock times."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest

from megha import cli
from megha.deploy import local
from megha.loadgen.progress import Progress

from servicekit import needs_rabbitmq

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_timing_options_reach_the_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_run_local(deployment: local.LocalDeployment, settings: Any, progress: Any = None) -> Any:
        seen["deployment"] = deployment
        raise ValueError("stop here")  # reported by the CLI as an error, exit code 2

    monkeypatch.setattr(local, "run_local", fake_run_local)
    argv = ["local", "--delta-interval", "0.5", "--heartbeat-interval", "0.25", "--worker-timeout", "3"]
    assert cli.main(argv) == 2
    d = seen["deployment"]
    assert (d.delta_interval, d.heartbeat_interval, d.worker_timeout) == (0.5, 0.25, 3.0)


@pytest.mark.parametrize(
    ("argv", "own", "warned"),
    [
        ([], True, False),  # real tasks, no broker named: a node of the run's own, without guest
        (["--execution", "simulated"], False, False),  # no task runs code: the machine's broker
        (["--amqp-url", "amqp://guest:guest@127.0.0.1:5672/"], False, True),  # named, and guest: said
        (["--amqp-url", "amqp://megha-gm:pw@127.0.0.1:5672/"], False, False),
    ],
)
def test_real_tasks_get_a_broker_of_the_run_s_own_unless_one_is_named(
    argv: list[str], own: bool, warned: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: dict[str, Any] = {}

    def fake_run_local(deployment: local.LocalDeployment, settings: Any, progress: Any = None) -> Any:
        seen["deployment"] = deployment
        raise ValueError("stop here")

    monkeypatch.setattr(local, "run_local", fake_run_local)
    assert cli.main(["local", *argv]) == 2
    assert seen["deployment"].own_broker is own
    assert ("every exec task of the run can log in as too" in capsys.readouterr().err) is warned


@pytest.mark.parametrize("option", ["--delta-interval", "--heartbeat-interval", "--worker-timeout"])
def test_non_positive_timings_are_refused_naming_the_option(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["local", option, "0"])
    assert option in capsys.readouterr().err


def _progress_given(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> Progress | None:
    seen: dict[str, Any] = {}

    def fake_run_local(deployment: local.LocalDeployment, settings: Any, progress: Progress | None = None) -> Any:
        seen["progress"] = progress
        raise ValueError("stop here")

    monkeypatch.setattr(local, "run_local", fake_run_local)
    assert cli.main(["local", *argv]) == 2
    return seen["progress"]


def test_a_bar_on_a_terminal_none_off_it_and_nothing_when_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stderr", Terminal())
    on_terminal = _progress_given(monkeypatch, [])
    assert on_terminal is not None and on_terminal.bar
    assert _progress_given(monkeypatch, ["--quiet"]) is None
    monkeypatch.setattr("sys.stderr", io.StringIO())
    piped = _progress_given(monkeypatch, [])
    assert piped is not None and not piped.bar  # its notes only, as `megha replay` off a terminal


@needs_rabbitmq
def test_a_local_run_on_a_terminal_shows_tasks_ended_and_the_time_left_and_reports_wall_time(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    argv = ["local", "--gms", "1", "--lms", "1", "--workers-per-lm", "1", "--execution", "simulated"]
    argv += ["--nodes-per-worker", "4", "--trace", "syn:4:10", "--time-scale", "0.3", "--out", str(tmp_path)]
    assert cli.main(argv) == 0, terminal.getvalue()
    shown = ANSI.sub("", terminal.getvalue())
    assert "replaying 10 jobs (40 tasks)" in shown, shown
    assert re.search(r"replaying .*\d+:\d\d:\d\d left .*/40 tasks .*/10 jobs submitted", shown), shown
    report = capsys.readouterr().out
    assert "40 tasks completed in" in report and "of wall time" in report, report
    assert "simulated" not in report, report
