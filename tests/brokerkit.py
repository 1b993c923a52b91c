"""The RabbitMQ the service tests use at 127.0.0.1:5672 when none answers there: a node of the test run's own, from
Debian's rabbitmq-server when it is installed, else a container of the megha-rabbitmq image (deploy/images/build.sh
builds it when it is missing), and `rabbitmqctl` for whichever of them runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = ROOT / "deploy" / "images" / "build.sh"
CONTAINER = "MEGHA_TEST_BROKER_CONTAINER"  # the name of the broker's container, while the test run has one
START_TIMEOUT = 180.0  # seconds for the container to answer AMQP clients (RabbitMQ boots in 10-25 s)


def rabbitmq_image() -> str:
    return os.environ.get("MEGHA_RABBITMQ_IMAGE", "megha-rabbitmq:bookworm")


def rabbitmqctl(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """`rabbitmqctl args` against the test run's broker: inside its container when it has one."""
    container = os.environ.get(CONTAINER)
    argv = ["docker", "exec", "-i", container, "rabbitmqctl"] if container else ["rabbitmqctl"]
    return subprocess.run([*argv, *args], **kwargs)


class BrokerContainer:
    """RabbitMQ in a container of `image`, published on 127.0.0.1:`port`, with the user guest/guest (the image lets
    it in from outside the container); removed by `destroy`."""

    def __init__(self, port: int, image: str | None = None) -> None:
        self.port = port
        self.image = image or rabbitmq_image()
        self.name = f"megha-test-rabbitmq-{uuid.uuid4().hex[:8]}"

    def start(self) -> None:
        """Build the image when it is missing, run the container and wait until it is healthy (AMQP listening)."""
        if _docker("image", "inspect", self.image).returncode != 0:
            built = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, cwd=ROOT, timeout=1800)
            if built.returncode != 0:
                raise RuntimeError(f"{BUILD_SCRIPT.relative_to(ROOT)} failed: {built.stderr[-2000:]}")
        users = ["-e", "RABBITMQ_DEFAULT_USER=guest", "-e", "RABBITMQ_DEFAULT_PASS=guest"]
        ports = ["-p", f"127.0.0.1:{self.port}:5672"]
        started = _docker("run", "-d", "--rm", "--name", self.name, *ports, *users, self.image)
        if started.returncode != 0:
            raise RuntimeError(f"docker run {self.image} failed: {started.stderr.strip()}")
        deadline = time.monotonic() + START_TIMEOUT
        while (health := self._health()) != "healthy":
            if health in ("unhealthy", "gone") or time.monotonic() > deadline:
                logs = _docker("logs", "--tail", "20", self.name)
                self.destroy()
                raise RuntimeError(f"the broker container is {health}: {logs.stdout[-2000:]}{logs.stderr[-2000:]}")
            time.sleep(1)  # Docker's own health check runs every 5 s: a finer poll would see nothing new

    def _health(self) -> str:
        state = _docker("inspect", "--format", "{{json .State}}", self.name)
        if state.returncode != 0:
            return "gone"
        return str(json.loads(state.stdout).get("Health", {}).get("Status", "starting"))

    def destroy(self) -> None:
        _docker("rm", "-f", self.name)


def _docker(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker") is None:
        raise RuntimeError("the docker command is not installed")
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
