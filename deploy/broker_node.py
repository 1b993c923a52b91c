"""A RabbitMQ node of a run's own, for the chaos matrix and the broker-outage tests: stopped (gracefully, or with
SIGKILL) and started again on the same data, so that durable queues and their messages outlive the outage as they
would on a real host. Two backends with one interface: Debian's `rabbitmq-server` run on this host with its data in
a folder of ours (`ServerNode`), or a container of the megha-rabbitmq image (`ContainerNode`); `broker_node`
takes the first this machine has."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from pathlib import Path, PurePosixPath

from megha.deploy import containers
from megha.deploy.containers import PUBLISHED_PORTS, DockerError, amqp_answers, docker, rabbitmq_image, run_detached
from megha.deploy.local import free_port

SERVER = "rabbitmq-server"
CTL = "rabbitmqctl"
TLS_FILES = ("certfile", "keyfile", "cacertfile")  # RabbitMQ's names of the PEM files of `tls`, in that order


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def broker_node(tls: tuple[Path, Path, Path] | None = None, port: int | None = None) -> BrokerNode:
    """A node of the backend this machine has: `rabbitmq-server` when it is on PATH, else a container when Docker
    has the RabbitMQ image; with neither, a RuntimeError of one line naming both ways and what is missing."""
    if shutil.which(SERVER) is not None:
        return ServerNode(tls, port)
    image = rabbitmq_image()
    if shutil.which("docker") is None:
        missing = "the docker command is not installed"
    else:
        try:
            docker("image", "inspect", image)
            return ContainerNode(tls, port, image)
        except DockerError as exc:
            missing = f"Docker has no image {image}" if "No such image" in str(exc) else " ".join(str(exc).split())
    raise RuntimeError(
        f"a RabbitMQ node of its own needs {SERVER} (Debian: apt-get install -y rabbitmq-server) or Docker with the "
        f"image {image} (deploy/images/build.sh builds it): {SERVER} is not on PATH and {missing}"
    )


class BrokerNode(ABC):
    """One RabbitMQ node on 127.0.0.1:`port` (guest/guest). Given `tls` (PEM files: certificate, key, CA bundle),
    it also listens for AMQPS on `tls_port` (`tls_url`) with that certificate. Its files are under `base`."""

    name: str  # the node's name (ServerNode) or its container's (ContainerNode)
    poll = 0.2  # seconds between two looks at a starting node

    def __init__(self, port: int) -> None:
        # In the system's temporary folder, 0700 (mkdtemp's mode): the node's data holds the messages (a task's
        # stderr tail among them) and its users' password hashes, and the pid file `kill` trusts. A ServerNode gives
        # the folder to the user the node runs as; a ContainerNode's TLS folder is bound into its container, which
        # reads it there whoever owns this one.
        self.base = Path(tempfile.mkdtemp(prefix="megha-rabbitmq-"))
        self.port = port
        self.tls_port: int | None = None  # set by a subclass given `tls`
        self.config: Path | None = None  # the TLS listener's configuration file, given `tls`

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def tls_url(self) -> str | None:
        return f"amqps://guest:guest@127.0.0.1:{self.tls_port}/" if self.tls_port is not None else None

    def _write_tls(self, tls: tuple[Path, Path, Path], listener: int, seen_at: PurePosixPath) -> Path:
        """Copy the PEM files to base/tls, readable by the node, beside `tls.conf`: a TLS listener on port `listener`
        with them, named where the node sees that folder (`seen_at`). Returns the configuration file."""
        folder = self.base / "tls"
        folder.mkdir(mode=0o755)
        for name, source in zip(TLS_FILES, tls):
            (folder / f"{name}.pem").write_bytes(source.read_bytes())
            (folder / f"{name}.pem").chmod(0o644)
        config = folder / "tls.conf"
        config.write_text(
            f"listeners.ssl.default = {listener}\n"
            + "".join(f"ssl_options.{name} = {seen_at / name}.pem\n" for name in TLS_FILES)
            + "ssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n"
        )
        config.chmod(0o644)
        return config

    def start(self, timeout: float = 120.0) -> None:
        """Start the node (on the data it had, if any) and wait until it has started: AMQP clients are answered and
        `rabbitmqctl await_startup` returns (every listener open)."""
        self._launch()
        deadline = time.monotonic() + timeout
        while not amqp_answers(self.port, timeout=1.0):
            self._fail_if_exited()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"RabbitMQ node {self.name} not answering on {self.port} after {timeout:g} s; "
                    f"the end of its log:\n{self.log_tail()}"
                )
            time.sleep(self.poll)
        try:
            self._ctl("await_startup", timeout=max(1.0, deadline - time.monotonic()))
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            raise TimeoutError(
                f"RabbitMQ node {self.name} did not start: {exc}; the end of its log:\n{self.log_tail()}"
            ) from None

    @abstractmethod
    def _launch(self) -> None:
        """Start the node's processes and return at once."""

    @abstractmethod
    def _fail_if_exited(self) -> None:
        """Raise, with the node's log, when the node `_launch` started has already ended."""

    @abstractmethod
    def _ctl_command(self) -> list[str]:
        """The command line that runs `rabbitmqctl` against this node (its arguments follow)."""

    @abstractmethod
    def log_tail(self, chars: int = 2000) -> str:
        """The end of the node's log."""

    @abstractmethod
    def stop(self) -> None:
        """A clean shutdown; returns once the node has stopped."""

    @abstractmethod
    def kill(self) -> None:
        """SIGKILL the node: a crash, with no clean shutdown; returns once it is gone."""

    def queues(self) -> list[str]:
        """The names of the queues the node holds."""
        out = self._ctl("list_queues", "-q", "--no-table-headers", "name", timeout=30)
        return [line.strip() for line in out.splitlines() if line.strip()]

    def ctl(self, *args: str, timeout: float, input: str | None = None) -> str:
        """`rabbitmqctl args` against this node (`input` on its standard input); RuntimeError when it fails."""
        return self._ctl(*args, timeout=timeout, input=input)

    def _ctl(self, *args: str, timeout: float, input: str | None = None) -> str:
        command, env = [*self._ctl_command(), *args], self._ctl_env()
        if input is None:
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        else:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, input=input)
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {self.name}: {done.stderr.strip()[-500:]}")
        return done.stdout

    def _ctl_env(self) -> dict[str, str] | None:
        """The environment `rabbitmqctl` runs in (None: this process's)."""
        return None

    def destroy(self) -> None:
        """Remove the node's files (a subclass first ends the node and removes what else it made)."""
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> BrokerNode:
        try:
            self.start()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


class ServerNode(BrokerNode):
    """Debian's `rabbitmq-server` on this host (its wrapper runs the node as the rabbitmq user), named
    `megha-<hex>@localhost`, loopback only, its data, log and pid file under `base`."""

    def __init__(self, tls: tuple[Path, Path, Path] | None = None, port: int | None = None) -> None:
        """`port`: the AMQP port (default: a free one)."""
        super().__init__(port or free_port())
        if os.geteuid() == 0:  # Debian's wrapper runs the node as the rabbitmq user, who writes its data here
            with contextlib.suppress(KeyError):
                owner = pwd.getpwnam("rabbitmq")
                os.chown(self.base, owner.pw_uid, owner.pw_gid)
        self.name = f"megha-{uuid.uuid4().hex[:8]}@localhost"
        # Erlang distribution, and the CLI tools' own ports at dist_port + 10000..10010 (RabbitMQ's default), kept
        # above the range services take their ports from (free_port), so neither can take a restarted one's port.
        self.dist_port = free_port(40_000, 50_000)
        if tls:
            self.tls_port = free_port()
            self.config = self._write_tls(tls, self.tls_port, PurePosixPath(self.base / "tls"))

    def _ctl_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "RABBITMQ_NODENAME": self.name,
                "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                "RABBITMQ_NODE_PORT": str(self.port),
                "RABBITMQ_DIST_PORT": str(self.dist_port),
                "RABBITMQ_MNESIA_BASE": str(self.base / "mnesia"),
                "RABBITMQ_LOG_BASE": str(self.base / "log"),
                "RABBITMQ_PID_FILE": str(self.base / "pid"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.base / "plugins"),
                "RABBITMQ_ENABLED_PLUGINS": "",
                # Erlang distribution on the loopback interface only, as AMQP: a node reachable from other hosts
                # would be guarded by its cookie alone (and a new epmd, should this node start it, there too).
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
                "ERL_EPMD_ADDRESS": "127.0.0.1",
            }
        )
        if self.config is not None:
            env["RABBITMQ_CONFIG_FILE"] = str(self.config)
        return env

    def _launch(self) -> None:
        (self.base / "pid").unlink(missing_ok=True)  # a killed node leaves its pid file behind
        subprocess.run([SERVER, "-detached"], env=self._ctl_env(), check=True, capture_output=True, timeout=30)

    def _fail_if_exited(self) -> None:
        """The node writes its pid file once its VM runs; a pid file whose process is gone is a node that ended."""
        pid = self._pid()
        if pid is None:
            return
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            raise RuntimeError(f"RabbitMQ node {self.name} ended; the end of its log:\n{self.log_tail()}") from None

    def _ctl_command(self) -> list[str]:
        return [CTL, "-n", self.name]

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the node's own log (its folder is removed with the node)."""
        logs = sorted((self.base / "log").glob("*.log"), key=lambda p: p.stat().st_mtime)
        if not logs:
            return "(no log)"
        with contextlib.suppress(OSError):
            return logs[-1].read_text(errors="replace")[-chars:]
        return "(log unreadable)"

    def _pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int((self.base / "pid").read_text().strip())
        return None

    def stop(self) -> None:
        """What `systemctl stop rabbitmq-server` does."""
        self._ctl("stop", timeout=60)
        self._wait_closed()

    def kill(self) -> None:
        """SIGKILL the node's Erlang VM, found by its node name (not by its pid file, which names whatever was written
        there last)."""
        for pid in self._vm_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._wait_closed()

    def _vm_pids(self) -> list[int]:
        """The Erlang VMs (beam.smp) started with this node's RABBITMQ_NODENAME: the node's own, whatever its pid
        file says (epmd, which the VM starts with the same environment, serves every node of the host: left be)."""
        name = f"RABBITMQ_NODENAME={self.name}".encode()
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                if Path(entry.path, "comm").read_bytes().strip() != b"beam.smp":
                    continue
                if name in Path(entry.path, "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:  # ended meanwhile, or another user's
                continue
        return found

    def _wait_closed(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while port_open(self.port) and time.monotonic() < deadline:
            time.sleep(0.1)

    def destroy(self) -> None:
        if port_open(self.port):
            self.kill()
        super().destroy()


TLS_PORT = 5671  # the container's AMQPS port (RabbitMQ's default)
CONF_D = PurePosixPath("/etc/rabbitmq/conf.d")  # read beside the image's own configuration


class ContainerNode(BrokerNode):
    """RabbitMQ in a container of the megha-rabbitmq image (deploy/images/build.sh), its AMQP (and AMQPS) port
    published on 127.0.0.1. Its data is in the image's volume (/var/lib/rabbitmq), which the container keeps when
    it is stopped or killed and started again; its hostname is fixed, so its node name (rabbit@<hostname>) is the
    same after the outage. `destroy` removes the container with its volume."""

    poll = 0.5  # each look also asks Docker whether the container ended

    def __init__(
        self, tls: tuple[Path, Path, Path] | None = None, port: int | None = None, image: str | None = None
    ) -> None:
        """`port`: the AMQP port (default: a free one of PUBLISHED_PORTS, drawn again if taken before the start)."""
        super().__init__(port or free_port(*PUBLISHED_PORTS))
        self.image = image or rabbitmq_image()
        self.name = f"megha-rabbitmq-{uuid.uuid4().hex[:8]}"
        self._port_chosen = port is not None
        if tls:
            self.tls_port = free_port(*PUBLISHED_PORTS)
            self.config = self._write_tls(tls, TLS_PORT, CONF_D)
        self._created = False  # by `docker run`; started again with `docker start`

    def _run_options(self) -> list[str]:
        argv = ["--name", self.name, "--hostname", self.name, "--label", f"{containers.LABEL}={self.name}"]
        argv += ["--publish", f"127.0.0.1:{self.port}:{containers.AMQP_PORT}"]
        argv += ["--env=RABBITMQ_DEFAULT_USER=guest", "--env=RABBITMQ_DEFAULT_PASS=guest"]
        if self.config is not None:
            argv += ["--publish", f"127.0.0.1:{self.tls_port}:{TLS_PORT}"]
            argv += ["--volume", f"{self.config.parent}:{CONF_D}:ro"]
        return [*argv, self.image]

    def _redraw(self) -> None:
        self.port = free_port(*PUBLISHED_PORTS)
        if self.tls_port is not None:
            self.tls_port = free_port(*PUBLISHED_PORTS)

    def _launch(self) -> None:
        """`docker run` the first time, `docker start` after a stop or a kill."""
        if self._created:
            docker("start", self.name)
            return
        run_detached(self.name, self._run_options, None if self._port_chosen else self._redraw)
        self._created = True

    def _fail_if_exited(self) -> None:
        if codes := containers.stopped(self.name):
            raise RuntimeError(f"RabbitMQ container {self.name} exited with {codes[self.name]}:\n{self.log_tail()}")

    def _ctl_command(self) -> list[str]:
        return ["docker", "exec", "-i", self.name, CTL]

    def log_tail(self, chars: int = 2000) -> str:
        return containers.log_tail(self.name, chars)

    def stop(self) -> None:
        """`docker stop`: SIGTERM, and RabbitMQ shuts down cleanly (SIGKILL only after 60 s)."""
        docker("stop", "--time", "60", self.name, timeout=90)

    def kill(self) -> None:
        """`docker kill`: SIGKILL to the container's init, which ends every process in it."""
        docker("kill", self.name)
        docker("wait", self.name)

    def destroy(self) -> None:
        docker("rm", "--force", "--volumes", self.name, check=False, timeout=120)
        super().destroy()
