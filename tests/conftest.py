"""Shared test configuration.

Tests that take the `reference_cluster` or `syn_250` fixture need ../shared (beside the repository: the traces and
the published reference cluster); they are marked `shared` and skip, naming the missing file, without it.

Tests marked `docker` need a Docker engine. They run by default and fail (in set-up, saying why) when the engine
does not answer; MEGHA_SKIP_DOCKER=1 skips them instead, for a machine without Docker.

Three pytest-xdist workers run the tests (`-n 3 --dist loadgroup` in pyproject.toml; `-n 0` runs them in this
process). Each worker runs whole modules (a module's fixtures are made once, on one worker), the Docker tests all on
one worker in turn, and the modules of `ALONE` alone: while one runs, no other worker starts a test (`_Turns`).
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import IO, TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from megha.deploy.broker_node import BrokerNode

SKIP_DOCKER = "MEGHA_SKIP_DOCKER"

# Services and apps a test builds in this process, or starts with this environment, check no credential unless the
# test turns authentication on. Deployments (`LocalDeployment`, `ContainerDeployment`, the compose demo, the swarm
# stack) make their own secrets and run with MEGHA_AUTH=on, as they do for users; tests/test_auth.py covers it.
os.environ.setdefault("MEGHA_AUTH", "off")


_OWN_BROKER: list[BrokerNode] = []  # the RabbitMQ node this test run started, if it started one
TURNS = "MEGHA_TEST_TURNS"  # the folder of the xdist workers' lock files (`_Turns`), made by the run's process
_TURNS_FOLDER: list[str] = []  # that folder, when this process made it


def pytest_configure(config: pytest.Config) -> None:
    """The broker nodes of the test run (deploy/broker_node.py) are Debian's rabbitmq-server when it is installed,
    else containers of the megha-rabbitmq image, which is built first (deploy/images/build.sh) when a Docker engine
    answers and lacks it. The service tests need RabbitMQ at 127.0.0.1:5672: when nothing answers there, the run
    starts such a node of its own on that port and stops it at the end (`brokerkit.rabbitmqctl` reaches it: through
    RABBITMQ_NODENAME, or in its container). Without either backend, the tests that need a broker say so."""
    if not hasattr(config, "workerinput"):  # the run's process, not an xdist worker: a folder for `_Turns`
        _TURNS_FOLDER.append(tempfile.mkdtemp(prefix="megha-tests-"))
        os.environ[TURNS] = _TURNS_FOLDER[0]
    from brokerkit import CONTAINER, ensure_rabbitmq_image

    from megha.deploy.broker_node import ContainerNode, broker_node, port_open

    if shutil.which("rabbitmq-server") is None and docker_problem() is None:
        try:
            ensure_rabbitmq_image()
        except (RuntimeError, subprocess.SubprocessError) as exc:
            _warn(config, f"no RabbitMQ image: {exc}")
    if port_open(5672):
        return
    try:
        node = broker_node(port=5672)
    except RuntimeError as exc:
        return _warn(config, str(exc))
    try:
        node.start()
    except (OSError, RuntimeError, TimeoutError, subprocess.SubprocessError) as exc:
        node.destroy()
        return _warn(config, f"could not start a RabbitMQ node: {exc}")
    _OWN_BROKER.append(node)
    os.environ[CONTAINER if isinstance(node, ContainerNode) else "RABBITMQ_NODENAME"] = node.name


def _warn(config: pytest.Config, text: str) -> None:
    config.issue_config_time_warning(pytest.PytestWarning(text), 3)


def pytest_unconfigure(config: pytest.Config) -> None:
    for node in _OWN_BROKER:
        node.destroy()
    _OWN_BROKER.clear()
    for folder in _TURNS_FOLDER:
        shutil.rmtree(folder, ignore_errors=True)
    _TURNS_FOLDER.clear()


SHARED_FIXTURES = ("reference_cluster", "syn_250")  # files of ../shared a test may take


def _shared_file(path: Path) -> Path:
    if not path.is_file():
        pytest.skip(f"needs {path} (../shared, beside the repository, holds the traces and the reference cluster)")
    return path


@pytest.fixture
def reference_cluster() -> Path:
    """The published 10,000-node reference cluster in ../shared."""
    from megha.loadgen.replay import REFERENCE_CLUSTER

    return _shared_file(REFERENCE_CLUSTER)


@pytest.fixture
def syn_250() -> Path:
    """The published syn_250 trace in ../shared."""
    from megha.sim.experiments.harness import TRACES

    return _shared_file(TRACES / "syn_250.0.tr")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if any(name in getattr(item, "fixturenames", ()) for name in SHARED_FIXTURES):
            item.add_marker(pytest.mark.shared)
        item.add_marker(pytest.mark.xdist_group("docker" if item.get_closest_marker("docker") else _module(item)))
    if os.environ.get(SKIP_DOCKER, "").lower() not in ("1", "true", "yes"):
        return
    skip = pytest.mark.skip(reason=f"{SKIP_DOCKER}=1: the Docker tests are turned off")
    for item in items:
        if item.get_closest_marker("docker") is not None:
            item.add_marker(skip)


@functools.cache
def docker_problem() -> str | None:
    """Why the Docker engine cannot be used, or None when it answers."""
    if shutil.which("docker") is None:
        return "the docker command is not installed"
    try:
        info = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 60 s"
    if info.returncode != 0:
        return f"the Docker engine does not answer: {info.stderr.strip() or info.stdout.strip()}"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("docker") is not None and (problem := docker_problem()) is not None:
        pytest.fail(f"{problem} (set {SKIP_DOCKER}=1 to skip the Docker tests)", pytrace=False)


ALONE = frozenset(
    {
        "test_drivers",
        "test_queueable_services",
        "test_services_e2e",
        "test_services_fairness",
        "test_task_isolation",
        "test_worker_enforcement",
        "test_worker_executor",
        "test_attacks",
    }
)
"""Modules whose tests time real work against the machine's two cores (exec tasks that burn their CPU for a
preemption to stop, memory and disk watches that must see a task over its limit in time): with a test of the other
worker beside them, a task's second of CPU took 18 s of wall time once. They run alone."""


def _module(item: pytest.Item) -> str:
    """The name of the test's module file, without its folder and suffix."""
    return Path(item.nodeid.split("::")[0]).stem


class _Turns:
    """The workers' turns at the machine, as a readers-writer lock on two files of the test run (flock): a test
    of a module of `ALONE` holds the machine alone from its module's first test to its last; any other test holds
    it shared for its own run. A worker waiting for its turn alone holds the gate, so that the others finish their
    tests and start no new one; a worker's set-up and tear-down of module fixtures are in its turn too."""

    def __init__(self, folder: Path) -> None:
        self._gate: IO[str] = open(folder / "gate", "a")  # noqa: SIM115 (open for the whole run)
        self._machine: IO[str] = open(folder / "machine", "a")  # noqa: SIM115
        self.alone: str | None = None  # the module holding the machine alone, while one does

    def take(self, module: str) -> None:
        """Wait for the turn of a test of `module` (none when its module holds the machine alone already)."""
        if self.alone == module:
            return
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        if module in ALONE:
            fcntl.flock(self._machine, fcntl.LOCK_EX)
            self.alone = module
        else:
            fcntl.flock(self._machine, fcntl.LOCK_SH)
            fcntl.flock(self._gate, fcntl.LOCK_UN)

    def give_back(self, next_module: str | None) -> None:
        """A test ended; `next_module` is the module of the worker's next test, if known."""
        if self.alone is not None and next_module == self.alone:
            return  # the module's next test keeps the machine alone
        fcntl.flock(self._machine, fcntl.LOCK_UN)
        if self.alone is not None:
            self.alone = None
            fcntl.flock(self._gate, fcntl.LOCK_UN)


_TURNS: list[_Turns] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """Under xdist, a test's set-up, run and tear-down in its worker's turn (`_Turns`)."""
    folder = os.environ.get(TURNS)
    if folder is None or not hasattr(item.config, "workerinput"):
        yield
        return
    if not _TURNS:
        _TURNS.append(_Turns(Path(folder)))
    turns = _TURNS[0]
    turns.take(_module(item))
    try:
        yield
    finally:
        turns.give_back(None if nextitem is None else _module(nextitem))
