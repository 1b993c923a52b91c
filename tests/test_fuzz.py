"""Fuzzing each service's HTTP API with schemathesis, over HTTP against real processes (docs/fuzzing.md).

Each service (GM, LM, worker agent) is fuzzed in a deployment of its own, started for it and thrown away after:
the LM's `POST /v1/gms/{gm}/claim` fences the GM it names and the GM's peer routes rewrite its journal copy, so
no operation is excluded and no run disturbs another's. Every generated request must get an answer that is not a
server error (a 503 is a documented "not ready, try again", nothing else of 5xx), whose status code is one the
service's `/openapi.json` documents for that operation and whose body matches the documented schema (errors: an
`ErrorBody`); and no service may log a traceback meanwhile (a background step that failed on fuzzed input).

`MEGHA_FUZZ_EXAMPLES` sets the examples schemathesis generates per operation and phase (default 15, a few minutes
in all); the big run of docs/fuzzing.md is `MEGHA_FUZZ_EXAMPLES=150 pytest tests/test_fuzz.py -rP`, which prints
how many requests each service answered. `MEGHA_FUZZ_SEED` replays a run (each run prints its seed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megha.deploy.local import LocalDeployment

from servicekit import needs_rabbitmq

EXAMPLES = int(os.environ.get("MEGHA_FUZZ_EXAMPLES", "15"))
SEED = os.environ.get("MEGHA_FUZZ_SEED")
CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,"
    "ignored_auth"  # every operation that declares the bearer scheme refuses a request without it
)
CONFIG = """\
request-timeout = 10

[checks.not_a_server_error]
# 503 is documented where a service answers it (not ready, or a GM identity changing hands: try again);
# status_code_conformance fails one answered where it is not.
expected-statuses = ["2xx", "3xx", "4xx", "503"]

[[operations]]
# A job's event stream stays open until the job ends, and the jobs the fuzzer submits run for as long as their
# fuzzed durations: schemathesis reads a stream until the request timeout, so it reads 2 s of this one (status,
# content type and the events sent at once are checked) instead of 10 s per request.
include-path = "/v1/jobs/{job_id}/events"
request-timeout = 2
"""

pytestmark = [needs_rabbitmq, pytest.mark.timeout(300 + EXAMPLES * 30)]


def _url(deployment: LocalDeployment, service: str) -> str:
    prefix = {"gm": "gm-0", "lm": "lm-0", "worker": "worker-0-0"}[service]
    return deployment.process(prefix).url


def _credential(deployment: LocalDeployment, service: str) -> str:
    """What the fuzzer authenticates as: at the GM its operator (every user route; the peer routes then answer
    403), at the LM a GM (every route but an agent's registration), at the agent its LM (every route). A signed
    token is valid for 5 minutes, longer than a default run of one service."""
    if service == "gm":
        return deployment.headers["Authorization"]
    role, ident = {"lm": ("gm", "0"), "worker": ("lm", "0")}[service]
    return deployment.headers_as(role, ident)["Authorization"]  # type: ignore[arg-type]


def _fuzz(url: str, work: Path, authorization: str) -> tuple[int, dict[str, object]]:
    """Run schemathesis against the service at `url`, every request with the `authorization` header: its exit code
    and its JSON report."""
    config, report = work / "schemathesis.toml", work / "report.json"
    config.write_text(CONFIG)
    command = [
        *(sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run", f"{url}/openapi.json"),
        *("--checks", CHECKS, "--max-examples", str(EXAMPLES), "--workers", "1"),
        *("--report", "json", "--report-json-path", str(report), "--no-color"),
        *("--header", f"Authorization: {authorization}"),
        *(("--seed", SEED) if SEED else ()),
    ]
    run = subprocess.run(command, capture_output=True, text=True, cwd=work, timeout=EXAMPLES * 30 + 240)
    print(run.stdout[-6000:], run.stderr[-2000:])
    assert report.exists(), f"schemathesis wrote no report (exit {run.returncode})"
    return run.returncode, json.loads(report.read_text())


@pytest.mark.parametrize("service", ["gm", "lm", "worker"])
def test_every_answer_is_documented_and_no_server_error(service: str, tmp_path: Path) -> None:
    # Two GMs: each keeps the other's journal copy, so the GM's peer routes get past their 404.
    deployment = LocalDeployment(gms=2, lms=1, workers_per_lm=1, execution="simulated", log_dir=tmp_path / "logs")
    with deployment:
        assert deployment.auth  # fuzzed as deployed: authentication on
        code, report = _fuzz(_url(deployment, service), tmp_path, _credential(deployment, service))
        exited = {p.name: p.popen.returncode for p in deployment.processes if p.popen.poll() is not None}
    cases = report["test_cases"]
    assert isinstance(cases, dict)
    print(f"{service}: {cases['generated']} requests, seed {report['seed']}, {cases['unique_failures']} failures")
    assert not exited, f"services exited while fuzzed: {exited}"
    assert code == 0 and not report["failures"] and not report["errors"], json.dumps(report["failures"])[:4000]
    assert cases["generated"] >= EXAMPLES  # the run generated requests at all
    tracebacks = {log.name: log.read_text() for log in (tmp_path / "logs").glob("*.log")}
    tracebacks = {
        name: text[text.index("Traceback") - 600 :][:3000] for name, text in tracebacks.items() if "Traceback" in text
    }
    assert not tracebacks, tracebacks
