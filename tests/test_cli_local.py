"""`megha local`'s options reach the deployment it starts (without starting it)."""

from __future__ import annotations

from typing import Any

import pytest

from megha import cli
from megha.deploy import local


def test_timing_options_reach_the_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_run_local(deployment: local.LocalDeployment, settings: Any) -> Any:
        seen["deployment"] = deployment
        raise ValueError("stop here")  # reported by the CLI as an error, exit code 2

    monkeypatch.setattr(local, "run_local", fake_run_local)
    argv = ["local", "--delta-interval", "0.5", "--heartbeat-interval", "0.25", "--worker-timeout", "3"]
    assert cli.main(argv) == 2
    d = seen["deployment"]
    assert (d.delta_interval, d.heartbeat_interval, d.worker_timeout) == (0.5, 0.25, 3.0)


@pytest.mark.parametrize("option", ["--delta-interval", "--heartbeat-interval", "--worker-timeout"])
def test_non_positive_timings_are_refused_naming_the_option(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["local", option, "0"])
    assert option in capsys.readouterr().err
