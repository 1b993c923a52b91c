"""The compose demo for real: docker-compose.yml on the images deploy/images/build.sh makes, replayed to the end.

The load generator must exit 0 with every task finished exactly once and its report written; `down -v` must then
leave no container, network or volume of the project behind. The demo's own file is used as a laptop user runs it;
a small override only moves the report from ./out to a temporary directory.
"""

from __future__ import annotations

import csv
import json
import uuid
from pathlib import Path

import pytest

from dockerkit import ROOT, build_images, compose_command, project_resources, run

pytestmark = pytest.mark.docker

UP_TIMEOUT = 480.0
"""Seconds for `up`: the broker and services start in about 20 s and the replay takes about 90 s."""
REPORT = ("tasks.csv", "jobs.csv", "summary.json", "utilization.csv", "cdf.png")


def _anonymous_volumes(project: str) -> list[str]:
    """Volumes the project's containers mount without a name (the broker image's VOLUME): unlabelled by Compose."""
    ids = run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"], 60).stdout.split()
    if not ids:
        return []
    mounts = run(["docker", "inspect", "--format", "{{json .Mounts}}", *ids], 60)
    assert mounts.returncode == 0, mounts.stderr
    return [m["Name"] for line in mounts.stdout.splitlines() for m in json.loads(line) if m["Type"] == "volume"]


def test_compose_demo_replays_every_task_exactly_once_and_leaves_nothing_behind(tmp_path: Path) -> None:
    images = build_images()
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # the load generator runs as uid 1000
    override = tmp_path / "report-dir.yml"
    override.write_text(f"services:\n  loadgen:\n    volumes:\n      - {out}:/out\n")
    project = f"megha-test-{uuid.uuid4().hex[:8]}"
    compose = [*compose_command(), "-p", project, "-f", str(ROOT / "docker-compose.yml"), "-f", str(override)]
    env = images.env()

    volumes: list[str] = []
    try:
        up = run([*compose, "up", "--no-color", "--exit-code-from", "loadgen"], UP_TIMEOUT, cwd=ROOT, env=env)
        volumes = _anonymous_volumes(project)
        logs = f"{up.stdout[-15000:]}\n{up.stderr[-5000:]}"
        assert up.returncode == 0, f"`up` ended with {up.returncode}; the services' output:\n{logs}"
        assert "wrote /out/" in up.stdout, f"the load generator wrote no report:\n{logs}"

        missing = [name for name in REPORT if not (out / name).is_file()]
        assert not missing, f"the report lacks {missing}; {out} holds {sorted(p.name for p in out.iterdir())}"
        summary = json.loads((out / "summary.json").read_text())
        counts = summary["counts"]
        assert counts["tasks"] > 0 and counts["jobs"] == 20, counts
        assert counts["tasks_completed"] == counts["tasks"], counts
        assert counts["tasks_failed"] == 0 and counts["jobs_rejected"] == 0, counts
        assert summary["not_exactly_once"] == [], summary["not_exactly_once"]
        with (out / "tasks.csv").open() as handle:
            completions = [int(row["completions"]) for row in csv.DictReader(handle)]
        assert len(completions) == counts["tasks"] and set(completions) == {1}, "a task did not finish exactly once"
    except BaseException:
        print(run([*compose, "logs", "--no-color", "--tail", "200"], 120, cwd=ROOT, env=env).stdout)
        raise
    finally:
        down = run([*compose, "down", "-v", "--remove-orphans", "--timeout", "10"], 180, cwd=ROOT, env=env)

    assert down.returncode == 0, down.stderr
    left = {kind: names for kind, names in project_resources(project).items() if names}
    assert not left, f"`down -v` left {left}"
    listed = set(run(["docker", "volume", "ls", "--format", "{{.Name}}"], 60).stdout.split())
    assert not listed & set(volumes), f"`down -v` left the anonymous volumes {sorted(listed & set(volumes))}"
