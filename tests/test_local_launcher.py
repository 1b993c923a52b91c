"""`megha local` starts separate processes, keeps their logs from other users, and leaves none behind, also when
interrupted."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from servicekit import needs_rabbitmq

pytestmark = needs_rabbitmq


def _processes_of(run_id: str) -> list[int]:
    """Pids whose environment names this deployment's run id."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if f"MEGHA_RUN_ID={run_id}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_megha_local_stops_every_service(tmp_path: Path, signum: int) -> None:
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "megha.cli",
            "local",
            "--execution",
            "simulated",
            "--nodes-per-worker",
            "5",
            "--gms",
            "1",
            "--lms",
            "1",
            "--workers-per-lm",
            "1",
            "--trace",
            "syn:2:1000",
            "--time-scale",
            "0.5",
            "--out",
            str(tmp_path),
            "--run-id",
            run_id,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        if "replaying" in line:
            break
        assert time.monotonic() < deadline, "the deployment did not start"
    assert len(_processes_of(run_id)) == 3  # GM, LM, worker agent
    # The services' logs are the operator's alone: an LM's and an agent's quote failed tasks' stderr tails.
    logs = tmp_path / "logs"
    assert stat.S_IMODE(logs.stat().st_mode) == 0o700
    modes = {log.name: stat.S_IMODE(log.stat().st_mode) for log in logs.iterdir()}
    assert len(modes) == 3 and set(modes.values()) == {0o600}, modes
    proc.send_signal(signum)
    assert proc.wait(timeout=30) == 130
    assert "every service was stopped" in proc.stdout.read()
    assert _processes_of(run_id) == []


def test_free_port_never_hands_out_a_port_twice() -> None:
    """Two services of one deployment given one port: the second cannot bind and the first answers in its name
    (a CI run lost a task so: worker-1-1's LM sent its launches to worker-0-0)."""
    from megha.deploy.local import free_port

    given = []
    with pytest.raises(RuntimeError, match="no free port"):
        for _ in range(20):
            given.append(free_port(61_000, 61_008))  # above the ephemeral range: nothing else takes these
    assert 0 < len(given) <= 8 and len(set(given)) == len(given), given


def test_a_service_answering_for_another_is_recognised() -> None:
    from megha.deploy.local import _answers_as

    assert _answers_as("gm-1", {"status": "ok", "gm": 1, "ready": True, "term": 0, "standing_in_for": []})
    assert not _answers_as("gm-1", {"status": "ok", "gm": 0, "ready": True, "term": 0, "standing_in_for": []})
    assert not _answers_as("gm-1", {"status": "ok", "lm": 1, "ready": True, "incarnation": 1})
    assert _answers_as("lm-0", {"status": "ok", "lm": 0, "ready": True, "incarnation": 1})
    assert _answers_as("worker-1-1", {"status": "ok", "worker": "worker-1-1", "registered": True})
    assert not _answers_as("worker-1-1", {"status": "ok", "worker": "worker-0-0", "registered": True})
