"""A RabbitMQ node of a run's own, for the chaos matrix and the broker-outage tests: Debian's `rabbitmq-server`
started on free ports with its data in a folder of ours, stopped (gracefully, or with SIGKILL) and started again
on the same data, so that durable queues and their messages outlive the outage as they would on a real host."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from megha.deploy.local import free_port

SERVER = "rabbitmq-server"
CTL = "rabbitmqctl"


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


class BrokerNode:
    """One RabbitMQ node on 127.0.0.1:`port` (guest/guest, loopback only), its data under `base`. Given `tls` (PEM
    files: certificate, key, CA bundle), it also listens for AMQPS on `tls_port` (`tls_url`) with that certificate."""

    def __init__(self, tls: tuple[Path, Path, Path] | None = None, port: int | None = None) -> None:
        """`port`: the AMQP port (default: a free one)."""
        if shutil.which(SERVER) is None:
            raise RuntimeError(f"{SERVER} is not installed (Debian: apt-get install -y rabbitmq-server)")
        # In the system's temporary folder: the Debian wrapper runs the node as the rabbitmq user, who must reach it.
        self.base = Path(tempfile.mkdtemp(prefix="megha-rabbitmq-"))
        self.base.chmod(0o777)
        self.name = f"megha-{uuid.uuid4().hex[:8]}@localhost"
        self.port = port or free_port()
        # Erlang distribution, and the CLI tools' own ports at dist_port + 10000..10010 (RabbitMQ's default), kept
        # above the range services take their ports from (free_port), so neither can take a restarted one's port.
        self.dist_port = free_port(40_000, 50_000)
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/"
        self.tls_port = free_port() if tls else None
        self.tls_url = f"amqps://guest:guest@127.0.0.1:{self.tls_port}/" if tls else None
        self.config: Path | None = None
        if tls:
            names = ("certfile", "keyfile", "cacertfile")
            for name, source in zip(names, tls):  # where the node, run as the rabbitmq user, can read them
                (self.base / f"{name}.pem").write_bytes(source.read_bytes())
                (self.base / f"{name}.pem").chmod(0o644)
            self.config = self.base / "tls.conf"
            self.config.write_text(
                f"listeners.ssl.default = {self.tls_port}\n"
                + "".join(f"ssl_options.{name} = {self.base / name}.pem\n" for name in names)
                + "ssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n"
            )
            self.config.chmod(0o644)

    def _env(self) -> dict[str, str]:
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
            }
        )
        if self.config is not None:
            env["RABBITMQ_CONFIG_FILE"] = str(self.config)
        return env

    def start(self, timeout: float = 60.0) -> None:
        """Start the node (on the data it had, if any) and wait until it accepts connections."""
        subprocess.run([SERVER, "-detached"], env=self._env(), check=True, capture_output=True, timeout=30)
        deadline = time.monotonic() + timeout
        while not port_open(self.port):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"RabbitMQ node {self.name} not listening on {self.port} after {timeout} s; "
                    f"the end of its log:\n{self.log_tail()}"
                )
            time.sleep(0.2)
        try:
            self._ctl("await_startup", timeout=max(1.0, deadline - time.monotonic()))
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            # Something listens on the port but the node did not start: another program took the port while
            # the node was down, or the node failed on its data.
            raise TimeoutError(
                f"RabbitMQ node {self.name} did not start: {exc}; the end of its log:\n{self.log_tail()}"
            ) from None

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the node's own log (its folder is removed with the node)."""
        logs = sorted((self.base / "log").glob("*.log"), key=lambda p: p.stat().st_mtime)
        if not logs:
            return "(no log)"
        with contextlib.suppress(OSError):
            return logs[-1].read_text(errors="replace")[-chars:]
        return "(log unreadable)"

    def pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int((self.base / "pid").read_text().strip())
        return None

    def stop(self) -> None:
        """A clean shutdown (what `systemctl stop rabbitmq-server` does)."""
        self._ctl("stop", timeout=60)
        self._wait_closed()

    def kill(self) -> None:
        """SIGKILL the node's Erlang VM: a crash, with no clean shutdown."""
        pid = self.pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._wait_closed()

    def _wait_closed(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while port_open(self.port) and time.monotonic() < deadline:
            time.sleep(0.1)

    def queues(self) -> list[str]:
        """The names of the queues the node holds."""
        out = self._ctl("list_queues", "-q", "--no-table-headers", "name", timeout=30)
        return [line.strip() for line in out.splitlines() if line.strip()]

    def _ctl(self, *args: str, timeout: float) -> str:
        done = subprocess.run(
            [CTL, "-n", self.name, *args], env=self._env(), capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {self.name}: {done.stderr.strip()[-500:]}")
        return done.stdout

    def destroy(self) -> None:
        """Kill the node and remove its data."""
        if port_open(self.port):
            self.kill()
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> BrokerNode:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
