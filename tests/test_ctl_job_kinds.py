"""`megha job list` says what kind each job is (class, gang, array, parents, retry rule) from the GM's `JobSummary`:
the real command against a GM answered by httpx.MockTransport, no services needed."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

import megha.ctl.common
from megha.client import Client
from megha.ctl import cli

GM = "http://gm.test"
ENV = {"COLUMNS": "200", "MEGHA_GM_URL": "", "MEGHA_GM_URLS": "", "MEGHA_LM_URLS": "", "MEGHA_API_TOKEN": "t"}


def _summary(job_id: str, **kind: Any) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "user": "alice",
        "queue": "alice",
        "gm": 0,
        "state": "queued",
        "tasks": 1,
        "task_states": {"queued": 1},
        **kind,
    }


JOBS = [
    _summary("plain", priority_class="normal"),
    _summary("mpi", priority_class="high", gang=True, array=4, depends_on=["a", "b"], retry=True),
    _summary("child", state="waiting", priority_class="low", depends_on=["plain"]),
]


@pytest.fixture
def gm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every client the CLI makes talks to one GM that lists JOBS."""

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/jobs", request.url
        return httpx.Response(200, json={"jobs": JOBS, "total": len(JOBS), "offset": 0, "limit": 100})

    monkeypatch.setattr(megha.ctl.common, "Client", functools.partial(Client, transport=httpx.MockTransport(answer)))


def _row(listed: str, job_id: str) -> list[str]:
    line = next(line for line in listed.splitlines() if re.search(rf"\b{job_id}\b", line))
    return [cell.strip() for cell in re.split(r"[│|]", line) if cell.strip()]


@pytest.mark.usefixtures("gm")
def test_job_list_shows_each_job_s_kind_compactly() -> None:
    run = CliRunner().invoke(cli, ["job", "list", "--gm", GM], env=ENV)
    assert run.exit_code == 0, run.output
    assert "kind" in run.output
    assert _row(run.output, "plain")[:6] == ["plain", "alice", "alice", "0", "queued", "-"]
    assert _row(run.output, "mpi")[5] == "high, gang, array of 4, after 2 jobs, retry"
    assert _row(run.output, "child")[4:6] == ["waiting", "low, after 1 job"]


@pytest.mark.usefixtures("gm")
def test_job_list_json_carries_the_fields_as_the_gm_sent_them() -> None:
    run = CliRunner().invoke(cli, ["job", "list", "--gm", GM, "--json"], env=ENV)
    assert run.exit_code == 0, run.output
    mpi = json.loads(run.output)["jobs"][1]
    assert {k: mpi[k] for k in ("priority_class", "gang", "array", "depends_on", "retry")} == {
        "priority_class": "high",
        "gang": True,
        "array": 4,
        "depends_on": ["a", "b"],
        "retry": True,
    }
