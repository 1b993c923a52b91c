"""The RabbitMQ of the test run: the megha-rabbitmq image, built (deploy/images/build.sh) when the run's broker nodes
are to be containers and Docker lacks it, and `rabbitmqctl` for the broker at 127.0.0.1:5672, whichever runs it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from megha.deploy.containers import DockerError, docker, rabbitmq_image

ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = ROOT / "deploy" / "images" / "build.sh"
CONTAINER = "MEGHA_TEST_BROKER_CONTAINER"  # the name of the broker's container, while the test run has one


def ensure_rabbitmq_image() -> None:
    """Build the RabbitMQ image when Docker does not have it (a few minutes, once)."""
    try:
        docker("image", "inspect", rabbitmq_image())
    except DockerError:
        built = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, cwd=ROOT, timeout=1800)
        if built.returncode != 0:
            raise RuntimeError(f"{BUILD_SCRIPT.relative_to(ROOT)} failed: {built.stderr[-2000:]}") from None


def rabbitmqctl(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """`rabbitmqctl args` against the test run's broker: inside its container when it has one."""
    container = os.environ.get(CONTAINER)
    argv = ["docker", "exec", "-i", container, "rabbitmqctl"] if container else ["rabbitmqctl"]
    return subprocess.run([*argv, *args], **kwargs)
