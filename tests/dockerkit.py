"""What the Docker tests share: the images deploy/images/build.sh makes (once per test run), bounded commands,
and the Compose command of this machine."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = ROOT / "deploy" / "images" / "build.sh"
BUILD_TIMEOUT = 1800.0
"""Seconds for build.sh: a first build on a fresh machine makes the Debian base and installs from PyPI."""


@dataclass(frozen=True)
class Images:
    base: str
    rabbitmq: str
    prometheus: str
    megha: str
    sizes: dict[str, int]  # image -> MB, as build.sh reported them

    def env(self) -> dict[str, str]:
        """The environment that points docker-compose.yml at these images."""
        return {
            **os.environ,
            "MEGHA_BASE_IMAGE": self.base,
            "MEGHA_RABBITMQ_IMAGE": self.rabbitmq,
            "MEGHA_PROMETHEUS_IMAGE": self.prometheus,
            "MEGHA_IMAGE": self.megha,
        }


def run(argv: list[str], timeout: float, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run a command with a deadline; fail the test with its output when the deadline passes."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kwargs)
    except subprocess.TimeoutExpired as exc:
        output = "\n".join(_text(s) for s in (exc.stdout, exc.stderr) if s)
        pytest.fail(f"{' '.join(map(str, argv))} did not end within {timeout:.0f} s:\n{output[-6000:]}")


def _text(data: str | bytes) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data


@functools.cache
def build_images() -> Images:
    """Run deploy/images/build.sh: the base, RabbitMQ and Prometheus images are reused when present, Megha's image
    follows the working tree (Docker's layer cache makes that quick when nothing changed)."""
    names = {
        "base": os.environ.get("MEGHA_BASE_IMAGE", "megha-base:bookworm"),
        "rabbitmq": os.environ.get("MEGHA_RABBITMQ_IMAGE", "megha-rabbitmq:bookworm"),
        "prometheus": os.environ.get("MEGHA_PROMETHEUS_IMAGE", "megha-prometheus:bookworm"),
        "megha": os.environ.get("MEGHA_IMAGE", "megha:latest"),
    }
    result = run([str(BUILD_SCRIPT)], BUILD_TIMEOUT, cwd=ROOT)
    if result.returncode != 0:
        pytest.fail(
            f"{BUILD_SCRIPT.relative_to(ROOT)} failed ({result.returncode}); as a user other than root, run it "
            f"once in a terminal (the Debian base needs sudo):\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
        )
    sizes = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\S+)\s+(\d+) MB$", result.stdout, re.M)}
    missing = [name for name in names.values() if name not in sizes]
    assert not missing, f"build.sh reported no size for {missing}:\n{result.stdout}"
    return Images(**names, sizes=sizes)


@functools.cache
def compose_command() -> list[str]:
    """`docker-compose` (v1, Debian's) when installed, else the `docker compose` plugin (v2)."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if run(["docker", "compose", "version"], 60).returncode == 0:
        return ["docker", "compose"]
    pytest.fail("neither docker-compose nor the docker compose plugin is installed")


def project_resources(project: str) -> dict[str, list[str]]:
    """The containers, networks and volumes Docker labels with this Compose project."""
    label = f"label=com.docker.compose.project={project}"
    listings = {
        "containers": ["docker", "ps", "-a", "--filter", label, "--format", "{{.Names}}"],
        "networks": ["docker", "network", "ls", "--filter", label, "--format", "{{.Name}}"],
        "volumes": ["docker", "volume", "ls", "--filter", label, "--format", "{{.Name}}"],
    }
    found = {}
    for kind, argv in listings.items():
        result = run(argv, 60)
        assert result.returncode == 0, result.stderr
        found[kind] = result.stdout.split()
    return found
