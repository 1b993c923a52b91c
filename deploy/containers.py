"""A deployment as containers on a private Docker network of its own (the container backend of `megha chaos`):
RabbitMQ, the LMs, their worker agents and the GMs, each a container of the images deploy/images/build.sh makes,
driven with the docker CLI: started, killed, started again, restarted, stopped, paused, cut off the network and
connected again. Everything it creates carries one label and is removed when it stops, also after a failure.

Containers reach each other at fixed addresses on the network, not by name. This host reaches the GMs, the LMs and
the broker through ports published on 127.0.0.1, chosen once so that a container started again gets the same ones.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from megha.common.auth import Credential, Role, new_secret, token_digest
from megha.deploy.deployment import Deployment
from megha.deploy.local import ALL_CONSTRAINTS, OPERATOR, free_port

LABEL = "org.megha.deployment"
"""Label on every container and the network of a deployment; its value is the deployment's name."""
BROKER = "rabbitmq"
AMQP_PORT = 5672
SERVICE_PORTS = {"gm": 8000, "lm": 8100, "worker": 8200}
"""Each role's MEGHA_PORT inside its container."""
AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
PUBLISHED_PORTS = (61_000, 65_536)
"""Where the containers' ports are published on 127.0.0.1: above Linux's ephemeral range (so no client of this host
is given one as its source port) and apart from the ports `megha local` and the process backend take
(10,000-32,767) and their RabbitMQ nodes' Erlang ports (40,000-60,010), so that a port one of them leaves free
while its process or broker is down is never taken by a container of a concurrent run."""


class DockerError(RuntimeError):
    pass


def rabbitmq_image() -> str:
    """The RabbitMQ image brokers run from (MEGHA_RABBITMQ_IMAGE; deploy/images/build.sh makes the default)."""
    return os.environ.get("MEGHA_RABBITMQ_IMAGE", "megha-rabbitmq:bookworm")


def docker(*args: str, timeout: float = 60.0, check: bool = True) -> str:
    """Run one docker command and return its output; DockerError with its message when it fails."""
    try:
        done = subprocess.run(
            ["docker", *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as exc:
        raise DockerError(f"docker {_shown(args)} did not end within {timeout:g} s") from exc
    if check and done.returncode != 0:
        raise DockerError(f"docker {_shown(args)}: {done.stderr.strip()[-1000:]}")
    return done.stdout


def _shown(args: tuple[str, ...]) -> str:
    """A docker command as an error message names it: the values of secret variables left out."""
    secret = ("CREDENTIAL", "AMQP_URL", "TOKEN", "PASS", "SECRET")
    return " ".join(
        f"{arg.partition('=')[0]}={arg.partition('=')[2].partition('=')[0]}=***"
        if arg.startswith("--env=") and any(word in arg.partition("=")[2].partition("=")[0] for word in secret)
        else arg
        for arg in args
    )


def run_detached(name: str, argv: Callable[[], list[str]], redraw: Callable[[], None] | None) -> None:
    """`docker run --detach` the container `name` with the options, image and command `argv()` gives. When a port it
    publishes on this host was taken between its draw and the start ("port is already allocated"), the failed
    container is removed, `redraw()` draws its ports again and it is run again (a few times); without `redraw`
    (ports the caller chose) the failure is raised."""
    for attempt in range(5):
        try:
            docker("run", "--detach", *argv())
            return
        except DockerError as exc:
            if "port is already allocated" not in str(exc) or redraw is None or attempt == 4:
                raise
            docker("rm", "--force", name, check=False)
            redraw()


def stopped(*names: str) -> dict[str, int]:
    """The exit status of each of the containers `names` that has stopped (exited, or dead), by name."""
    out = docker("inspect", "--format", "{{.Name}} {{.State.Status}} {{.State.ExitCode}}", *names)
    codes = {}
    for line in out.splitlines():
        name, status, code = line.strip().lstrip("/").split()
        if status in ("exited", "dead"):
            codes[name] = int(code)
    return codes


def log_tail(name: str, chars: int = 3000) -> str:
    """The end of the container `name`'s output, stdout and stderr interleaved."""
    argv = ["docker", "logs", name]
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "(docker logs did not answer within 30 s)"
    return done.stdout[-chars:]


def amqp_answers(port: int, timeout: float = 2.0) -> bool:
    """True when 127.0.0.1:`port` answers an AMQP 0-9-1 header with a frame. A published port accepts connections
    even while nothing listens in its container (Docker's proxy does), so connecting alone proves nothing."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(AMQP_HEADER)
            return s.recv(1) == b"\x01"  # a method frame: connection.start
    except OSError:
        return False


@dataclass
class Container:
    service: str  # gm-0, lm-1, worker-0-1, rabbitmq
    name: str  # the container's name
    ip: str  # its fixed address on the network
    port: int  # the port it serves inside
    host_port: int | None  # where it is published on 127.0.0.1, or None
    run: list[str] = field(default_factory=list)  # `docker run` options, image and command

    @property
    def url(self) -> str:
        """Where this host reaches its HTTP service."""
        return f"http://127.0.0.1:{self.host_port}"

    @property
    def inner_url(self) -> str:
        """Where the other containers reach its HTTP service."""
        return f"http://{self.ip}:{self.port}"


@dataclass
class ContainerDeployment(Deployment):
    """G GMs, L LMs and W worker agents per LM (every node satisfying every constraint) and a RabbitMQ of their own,
    as containers on the network `name`.

    Every container has a fixed address, kept when it is started or connected again, and the services are given
    addresses rather than names: on this machine's Docker 20.10 names are unreliable under these faults. The
    embedded DNS stopped answering for a minute or more whenever another program turned swarm mode on or off, and
    `docker network disconnect` deletes from the container's /etc/hosts every line with a peer's address (entries
    given with --add-host included), which `docker network connect` does not put back."""

    execution: str = "simulated"
    image: str = field(default_factory=lambda: os.environ.get("MEGHA_IMAGE", "megha:latest"))
    rabbitmq_image: str = field(default_factory=rabbitmq_image)
    log_dir: Path = Path("out/containers/logs")
    name: str = field(default_factory=lambda: f"megha-{uuid.uuid4().hex[:8]}")
    containers: dict[str, Container] = field(default_factory=dict)
    cluster_secret: str = field(default_factory=new_secret, repr=False)  # made afresh for each deployment
    operator_token: str = field(default_factory=new_secret, repr=False)  # API token of the user `operator`
    broker_password: str = field(default_factory=new_secret, repr=False)  # of the broker's user `megha`

    @property
    def run_id(self) -> str:
        return self.name

    @property
    def headers(self) -> dict[str, str]:
        """The operator's Authorization header, for calls to this deployment's services."""
        return {"Authorization": f"Bearer {self.operator_token}"}

    @property
    def amqp_url(self) -> str:
        """The broker as this host reaches it."""
        return f"amqp://megha:{self.broker_password}@127.0.0.1:{self.containers[BROKER].host_port}/"

    @property
    def gm_urls(self) -> list[str]:
        return [self.containers[f"gm-{g}"].url for g in range(self.gms)]

    @property
    def lm_urls(self) -> list[str]:
        return [self.containers[f"lm-{lm}"].url for lm in range(self.lms)]

    def _plan(self, prefix: str) -> None:
        """Name, address, ports and `docker run` arguments of every container, on the /24 network `prefix`.x."""
        services = [BROKER]
        for lm in range(self.lms):
            services += [f"lm-{lm}", *(f"worker-{lm}-{w}" for w in range(self.workers_per_lm))]
        services += [f"gm-{g}" for g in range(self.gms)]
        for i, service in enumerate(services):
            port = AMQP_PORT if service == BROKER else SERVICE_PORTS[service.split("-")[0]]
            published = not service.startswith("worker-")
            self.containers[service] = Container(
                service, f"{self.name}-{service}", f"{prefix}.{10 + i}", port, self._host_port() if published else None
            )
        lm_urls = [self.containers[f"lm-{lm}"].inner_url for lm in range(self.lms)]
        broker_user = ["--env=RABBITMQ_DEFAULT_USER=megha", f"--env=RABBITMQ_DEFAULT_PASS={self.broker_password}"]
        self._megha_run(BROKER, [*broker_user, self.rabbitmq_image])
        for lm in range(self.lms):
            self._service(
                f"lm-{lm}",
                "megha.services.lm",
                lm_id=lm,
                num_gms=self.gms,
                expected_nodes=self.workers_per_lm * self.nodes_per_worker,
                delta_interval=self.delta_interval,
                worker_timeout=self.worker_timeout,
            )
            for w in range(self.workers_per_lm):
                self._service(
                    f"worker-{lm}-{w}",
                    "megha.services.worker",
                    worker_id=f"worker-{lm}-{w}",
                    lm_url=lm_urls[lm],
                    execution=self.execution,
                    nodes=self.nodes_per_worker,
                    heartbeat_interval=self.heartbeat_interval,
                    constraints=ALL_CONSTRAINTS,
                )
        gm_urls = ",".join(self.containers[f"gm-{g}"].inner_url for g in range(self.gms))
        for gm in range(self.gms):
            # The journal stays in the container's own filesystem, which `docker kill` + `docker start` keeps.
            self._service(
                f"gm-{gm}",
                "megha.services.gm",
                gm_id=gm,
                lm_urls=",".join(lm_urls),
                gm_urls=gm_urls,
                journal_dir="journal",
            )

    def _service(self, service: str, module: str, **values: object) -> None:
        container = self.containers[service]
        role: Role = module.rsplit(".", 1)[-1]  # type: ignore[assignment]
        ident = values.get("worker_id", values.get("lm_id", values.get("gm_id")))
        env: dict[str, object] = {
            "MEGHA_AMQP_URL": f"amqp://megha:{self.broker_password}@{self.containers[BROKER].ip}:{AMQP_PORT}/",
            "MEGHA_HOST": "0.0.0.0",
            "MEGHA_PORT": container.port,
            "MEGHA_PUBLIC_URL": container.inner_url,
            "MEGHA_RUN_ID": self.run_id,
            "MEGHA_LOG_LEVEL": "info",
            "MEGHA_CREDENTIAL": Credential.issue(self.cluster_secret, role, str(ident)).encode(),  # its own only
            "MEGHA_API_TOKENS": f"{OPERATOR}={token_digest(self.operator_token)}",
            "MEGHA_OPERATORS": OPERATOR,
            **{f"MEGHA_{k.upper()}": v for k, v in values.items()},
        }
        self._megha_run(service, [*(f"--env={k}={v}" for k, v in env.items()), self.image, "python", "-m", module])

    def _megha_run(self, service: str, tail: list[str]) -> None:
        container = self.containers[service]
        argv = ["--name", container.name, "--hostname", service, "--label", f"{LABEL}={self.name}"]
        argv += ["--network", self.name, "--ip", container.ip]
        if container.host_port is not None:
            argv += ["--publish", f"127.0.0.1:{container.host_port}:{container.port}"]
        container.run = [*argv, *tail]

    def _create_network(self) -> str:
        """Create the network on a free /24 of 10.64.0.0/10 (Docker's own pools are in 172.16/12 and 192.168/16);
        returns its prefix (`10.x.y`)."""
        for _ in range(50):
            prefix = f"10.{random.randrange(64, 128)}.{random.randrange(256)}"
            try:
                docker("network", "create", "--label", f"{LABEL}={self.name}", f"--subnet={prefix}.0/24", self.name)
            except DockerError as exc:
                if "overlap" in str(exc):
                    continue
                raise
            return prefix
        raise DockerError("no free /24 in 10.64.0.0/10 for the network")

    def _host_port(self) -> int:
        """A free port of PUBLISHED_PORTS that no container of this deployment publishes yet (free_port only knows
        that nothing binds it now: Docker binds it when the container starts)."""
        taken = {c.host_port for c in self.containers.values()}
        while (port := free_port(*PUBLISHED_PORTS)) in taken:
            pass
        return port

    def start_all(self) -> None:
        """Create the network and start the broker, then every LM with its agents, then the GMs. A published port
        another program took between the plan and the start is given up for another (a few times)."""
        self._plan(self._create_network())
        for service, container in self.containers.items():
            self._run(container)
            if service == BROKER:
                self.wait_broker()

    def _run(self, container: Container) -> None:
        """`docker run` the container as planned; a port it publishes that was taken since is drawn again."""

        def redraw() -> None:
            old = f"127.0.0.1:{container.host_port}:{container.port}"
            container.host_port = self._host_port()
            new = f"127.0.0.1:{container.host_port}:{container.port}"
            container.run = [new if arg == old else arg for arg in container.run]

        run_detached(container.name, lambda: container.run, redraw if container.host_port is not None else None)

    def wait_broker(self, timeout: float = 90.0) -> None:
        """Until RabbitMQ answers AMQP clients; fails with its log when its container stops or time runs out."""
        deadline = time.monotonic() + timeout
        while not amqp_answers(self.containers[BROKER].host_port or 0):
            self._fail_if_exited([BROKER])
            if time.monotonic() > deadline:
                raise TimeoutError(f"RabbitMQ not answering after {timeout:g} s:\n{self.log_tail(BROKER)}")
            time.sleep(0.2)

    def wait_healthy(self, timeout: float = 120.0) -> None:
        """Until every GM and LM answers ready (an LM is ready once its agents registered every node); a container
        that exits fails fast with its log."""
        deadline = time.monotonic() + timeout
        while True:
            self._fail_if_exited(list(self.containers))
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                if all(httpx.get(f"{u}/healthz", timeout=1.0).json()["ready"] for u in self.gm_urls + self.lm_urls):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ready after {timeout:g} s: {self.gm_urls + self.lm_urls}")
            time.sleep(0.2)

    def _fail_if_exited(self, services: list[str]) -> None:
        for name, code in stopped(*(self.containers[s].name for s in services)).items():
            service = name.removeprefix(f"{self.name}-")
            raise RuntimeError(f"{service} exited with {code}:\n{self.log_tail(service)}")

    def log_tail(self, service: str, chars: int = 3000) -> str:
        """The end of the container's output, stdout and stderr interleaved."""
        return log_tail(self.containers[service].name, chars)

    # Faults, named after the docker commands that make them.

    def kill(self, service: str) -> None:
        """SIGKILL every process of the container (a crash: no clean shutdown)."""
        docker("kill", self.containers[service].name)

    def stop(self, service: str) -> None:
        """SIGTERM, then SIGKILL after 10 s (a clean shutdown)."""
        docker("stop", "--time", "10", self.containers[service].name, timeout=90)

    def start(self, service: str) -> None:
        """Start a killed or stopped container again: same filesystem, settings and published ports. Returns once
        the broker answers again; a Megha service's own start-up is not waited for."""
        docker("start", self.containers[service].name)
        if service == BROKER:
            self.wait_broker()

    def restart(self, service: str) -> None:
        """`docker restart`: stop (SIGTERM, SIGKILL after 10 s), then start; as `start` for what it waits for."""
        docker("restart", "--time", "10", self.containers[service].name, timeout=90)
        if service == BROKER:
            self.wait_broker()

    def pause(self, service: str) -> None:
        """Freeze every process of the container (cgroup freezer): it holds its connections but answers nothing."""
        docker("pause", self.containers[service].name)

    def unpause(self, service: str) -> None:
        docker("unpause", self.containers[service].name)

    def disconnect(self, service: str) -> None:
        """Take the container off the network: nothing reaches it or leaves it, its published ports included."""
        docker("network", "disconnect", self.name, self.containers[service].name)

    def connect(self, service: str) -> None:
        """Back on the network, at the same address."""
        container = self.containers[service]
        docker("network", "connect", "--ip", container.ip, self.name, container.name)

    # Clean-up.

    def leftovers(self) -> dict[str, list[str]]:
        """Containers and networks of this deployment that Docker still has (none once it stopped)."""
        label = f"label={LABEL}={self.name}"
        return {
            "containers": docker("ps", "--all", "--quiet", "--filter", label).split(),
            "networks": docker("network", "ls", "--quiet", "--filter", label).split(),
        }

    def remove(self) -> None:
        """Save every container's log to `log_dir`, then remove the containers (with their anonymous volumes: the
        broker's data) and the network. Each step goes on when an earlier one failed."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for service, container in self.containers.items():
            with (self.log_dir / f"{service}.log").open("wb") as log, contextlib.suppress(Exception):
                subprocess.run(
                    ["docker", "logs", "--timestamps", container.name],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=60,
                    check=False,
                )
        with contextlib.suppress(DockerError):
            ids = self.leftovers()["containers"]
            if ids:
                docker("rm", "--force", "--volumes", *ids, timeout=120)
        with contextlib.suppress(DockerError):
            for network in self.leftovers()["networks"]:
                docker("network", "rm", network)
        with contextlib.suppress(DockerError):
            left = {kind: names for kind, names in self.leftovers().items() if names}
            if left:
                print(f"megha: could not remove {left} of {self.name}", file=sys.stderr)

    def bring_up(self) -> None:
        self.start_all()
        self.wait_healthy()

    def tear_down(self) -> None:
        self.remove()
