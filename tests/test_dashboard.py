"""The GM's dashboard in a real browser: headless Chromium (Debian's `chromium`) loads `GET /dashboard` from a
running GM (separate processes, the real RabbitMQ) and the figures the page shows must be the API's. The page
and its assets come from the GM itself: nothing from a CDN (the browser runs with the network to anything but the
GM unreachable, so a remote asset would fail the test)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from megha.deploy.local import LocalDeployment

from servicekit import api, needs_rabbitmq, wait_until

pytestmark = needs_rabbitmq

NODE = {"cpu_millicores": 2000, "memory_mb": 4096}


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (Debian: apt-get install -y chromium); .ci/run installs it")
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    return found


def _browse(url: str, tmp_path: Path, *extra: str) -> str:
    """The page's DOM after its scripts ran (a few seconds of virtual time)."""
    argv = [
        _chromium(),
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium'}",
        "--proxy-server=http://127.0.0.1:9",  # nothing but the GM on localhost is reachable: no CDN
        "--proxy-bypass-list=127.0.0.1",
        "--virtual-time-budget=6000",
        "--dump-dom",
        *extra,
        url,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _attr(dom: str, testid: str, name: str) -> str:
    found = re.search(rf'<[^>]*data-testid="{re.escape(testid)}"[^>]*>', dom)
    assert found, f"{testid} is not on the page"
    value = re.search(rf'{name}="([^"]*)"', found.group(0))
    assert value, f"{testid} has no {name}: {found.group(0)}"
    return value.group(1)


def _job(job_id: str, tasks: int, duration: float) -> dict[str, object]:
    return {"job_id": job_id, "user": "alice", "tasks": [{"duration": duration, **NODE} for _ in range(tasks)]}


def test_the_dashboard_shows_what_the_api_says(tmp_path: Path) -> None:
    _chromium()
    deployment = LocalDeployment(gms=1, lms=2, workers_per_lm=1, execution="simulated", log_dir=tmp_path / "logs")
    with deployment:
        api.use(deployment)
        gm = deployment.gm_urls[0]

        def states(job_id: str) -> list[str]:
            return [t["state"] for t in api.get(f"{gm}/v1/jobs/{job_id}", timeout=5).json()["tasks"]]

        assert api.post(f"{gm}/v1/jobs", json=_job("short", 1, 0.1), timeout=10).status_code == 201
        wait_until(lambda: states("short") == ["finished"], 30)
        assert api.post(f"{gm}/v1/jobs", json=_job("long", 2, 600.0), timeout=10).status_code == 201
        wait_until(lambda: states("long") == ["launched", "launched"], 30)
        retried = {**_job("waits", 1, 1.0), "priority_class": "low", "retry": {"max_attempts": 2}}
        assert api.post(f"{gm}/v1/jobs", json=retried, timeout=10).status_code == 201
        child = {**_job("child", 1, 1.0), "depends_on": ["long", "short"], "gang": True, "array": 2}
        assert api.post(f"{gm}/v1/jobs", json=child, timeout=10).status_code == 201
        assert api.post(f"{gm}/v1/jobs", json=_job("gone", 1, 1.0), timeout=10).status_code == 201
        assert api.delete(f"{gm}/v1/jobs/gone", timeout=10).status_code == 202
        wait_until(
            lambda: all(p["used_fraction"] == 1.0 for p in api.get(f"{gm}/v1/overview").json()["partitions"]), 30
        )

        locked = _browse(f"{gm}/dashboard", tmp_path)  # no token: the page asks for one and shows no data
        dom = _browse(f"{gm}/dashboard#token={deployment.operator_token}", tmp_path)
        view = api.get(f"{gm}/v1/overview", timeout=5).json()
        listed = {j["job_id"]: j for j in api.get(f"{gm}/v1/jobs", timeout=5).json()["jobs"]}

    assert "needs an operator's API token" in locked and 'data-testid="token-form" hidden' not in locked
    assert 'data-testid="partition-' not in locked
    assert 'data-testid="token-form" hidden' in dom

    assert "cannot read the GM" not in dom and "GM 0" in dom
    for p in view["partitions"]:
        assert float(_attr(dom, f"partition-{p['lm']}-{p['gm']}", "data-used")) == p["used_fraction"] == 1.0
    assert {s: int(_attr(dom, f"jobs-{s}", "data-value")) for s in view["jobs"]} == view["jobs"]
    assert view["jobs"] == {"finished": 1, "running": 1, "queued": 1, "cancelled": 1, "waiting": 1}
    assert {s: int(_attr(dom, f"tasks-{s}", "data-value")) for s in view["tasks"]} == view["tasks"]
    (queue,) = view["queues"]
    assert int(re.search(r'data-testid="queue-default-pending"[^>]*>(\d+)<', dom).group(1)) == queue["pending"] == 1  # type: ignore[union-attr]
    assert int(re.search(r'data-testid="queue-default-running"[^>]*>(\d+)<', dom).group(1)) == queue["running"] == 2  # type: ignore[union-attr]
    assert int(_attr(dom, "alloc-summary", "data-count")) == view["allocation_time"]["count"] >= 3
    shown = {"short": "finished", "long": "running", "waits": "queued", "gone": "cancelled", "child": "waiting"}
    for job_id, state in shown.items():
        assert _attr(dom, f"job-{job_id}", "data-state") == listed[job_id]["state"] == state
        assert _attr(dom, f"job-{job_id}", "data-class") == listed[job_id]["priority_class"]
    assert [listed[j]["priority_class"] for j in shown] == ["normal", "normal", "low", "normal", "normal"]
    kinds = {j: _attr(dom, f"job-{j}", "data-kind") for j in shown}
    assert kinds == {"short": "", "long": "", "waits": "retry", "gone": "", "child": "gang, array of 2, after 2 jobs"}


def test_the_dashboard_and_its_assets_are_served_by_the_gm_not_a_cdn() -> None:
    page = (Path(__file__).parents[1] / "services" / "dashboard" / "static" / "index.html").read_text()
    script = (Path(__file__).parents[1] / "services" / "dashboard" / "static" / "dashboard.js").read_text()
    assert not re.search(r'(src|href)="(https?:)?//', page), "a remote asset in the page"
    assert "http://" not in script.replace('"http://www.w3.org/2000/svg"', "") and "https://" not in script


def test_every_service_s_api_docs_render_offline(tmp_path: Path) -> None:
    """`GET /docs` of a GM, an LM and an agent renders in a browser that can reach nothing but the service: Swagger
    UI's assets come from the service, not a CDN (FastAPI's default)."""
    _chromium()
    deployment = LocalDeployment(gms=1, lms=1, workers_per_lm=1, execution="simulated", log_dir=tmp_path / "logs")
    with deployment:
        api.use(deployment)
        urls = {
            "gm": deployment.gm_urls[0],
            "lm": deployment.lm_urls[0],
            "worker": deployment.process("worker-0-0").url,
        }
        for role, url in urls.items():
            page = api.get(f"{url}/docs", timeout=5).text
            assert "cdn." not in page and "/docs/assets/swagger-ui-bundle.js" in page, page
            dom = _browse(f"{url}/docs", tmp_path)
            route = {"gm": "/v1/jobs", "lm": "/v1/launch", "worker": "/v1/tasks"}[role]
            assert 'class="swagger-ui' in dom and route in dom, f"{role}: Swagger UI did not render {route}"
            assert api.get(f"{url}/redoc", timeout=5).status_code == 404
