"""`megha local`: start G GMs, L LMs and W worker agents per LM as separate processes against RabbitMQ, wait until
they are healthy, replay a trace through them, print the report, and shut everything down (also on Ctrl-C)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from pydantic import SecretStr

from megha.common.auth import Credential, Role, Signer, new_secret, token_digest
from megha.common.core.constraints import NUM_CONSTRAINTS
from megha.common.settings import LoadgenSettings
from megha.common.transport.rabbit import Broker, gm_key, lm_key
from megha.deploy.deployment import Deployment
from megha.loadgen.progress import Progress
from megha.loadgen.services import ServicesRun, replay_services

ALL_CONSTRAINTS = ",".join(str(c) for c in range(NUM_CONSTRAINTS))
OPERATOR = "operator"
"""The user whose API token `megha local` makes: it acts for every user (MEGHA_OPERATORS)."""


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_HANDED_OUT: set[int] = set()
"""Every port `free_port` has returned in this process. A port is free when it is handed out but taken only when
its service binds it, later; without this, two services of one deployment could be given the same port, and the
second, failing to bind, would leave the first answering in its name."""
_HANDING_OUT = threading.Lock()


def free_port(low: int = 10_000, high: int | None = None) -> int:
    """A free port in [low, high), by default below the ephemeral range, never one this process was given before.
    A service restarted on its port must find it free: in the ephemeral range, a client retrying the dead service
    could be given that very port as its own source port and connect to itself (TCP self-connect), holding it."""
    high = high if high is not None else max(_ephemeral_low(), low + 1)
    with _HANDING_OUT:
        for _ in range(200):
            port = random.randrange(low, high)
            if port in _HANDED_OUT:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no free port between {low} and {high}")


INHERITED_SECRETS = frozenset(
    f"MEGHA_{name}{suffix}"
    for name in ("CLUSTER_SECRET", "CREDENTIAL", "API_TOKENS", "API_TOKEN")
    for suffix in ("", "_FILE")
)
"""Variables of this process a service is never given: each gets its own credential and the users' token digests."""


@dataclass
class Process:
    name: str
    url: str
    popen: subprocess.Popen[bytes]
    log: Path
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class LocalDeployment(Deployment):
    """A deployment on this host. Worker nodes satisfy every constraint unless `constraint_seed` is set, in which
    case each agent's constraints are drawn with the published machine fractions (and some jobs of a constrained
    trace may then be unschedulable on a small deployment)."""

    execution: str = "real"
    node_cpu_millicores: int = 2000
    node_memory_mb: int = 4096
    constraint_seed: int | None = None
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    run_id: str = field(default_factory=lambda: f"local-{uuid.uuid4().hex[:8]}")
    log_dir: Path = Path("out/local/logs")
    queues: str = ""  # fair scheduling: user:share:gm,... (empty: off), given to every GM and LM
    share_policy: str = "share"
    takeover_after: float = 45.0  # a GM down this long is stood in for by the next GM (0: never)
    amqp_urls: dict[str, str] = field(default_factory=dict)  # role (gm, lm, worker, loadgen) -> its broker URL
    # `bring_up` starts a RabbitMQ node of the run's own, with a user per role and no guest (deploy/run_broker.py)
    own_broker: bool = False
    _broker: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, init=False, repr=False, compare=False)
    tls_cert: str = ""  # with tls_key: every service serves HTTPS with this certificate (for 127.0.0.1)
    tls_key: str = ""
    tls_ca: str = ""  # CA bundle verifying the services and an amqps:// broker (empty: the system's)
    auth: bool = True  # False: MEGHA_AUTH=off, no credential checked (development only)
    cluster_secret: str = field(default_factory=new_secret, repr=False)  # made afresh for each deployment
    operator_token: str = field(default_factory=new_secret, repr=False)  # API token of the user `operator`
    user_tokens: dict[str, str] = field(default_factory=dict, repr=False)  # more users' API tokens, by user
    # agent ("worker-<lm>-<w>") -> its further settings, MEGHA_ names without the prefix: {"drivers": "burn,exec"}
    worker_settings: dict[str, dict[str, object]] = field(default_factory=dict)
    gm_settings: dict[str, object] = field(default_factory=dict)  # every GM's further settings, as worker_settings'
    processes: list[Process] = field(default_factory=list)

    @property
    def headers(self) -> dict[str, str]:
        """The operator's Authorization header, for calls to this deployment's services ({} without auth)."""
        return {"Authorization": f"Bearer {self.operator_token}"} if self.auth else {}

    def loadgen(self, settings: LoadgenSettings) -> LoadgenSettings:
        """`settings` of a load generator pointed at this running deployment, with its operator's token."""
        return settings.model_copy(
            update={
                "gm_urls": self.gm_urls,
                "run_id": self.run_id,
                "amqp_url": self.amqp_urls.get("loadgen", self.amqp_url),
                "tls_ca": self.tls_ca,
                "queues": self.queues,
                "share_policy": self.share_policy,
                "auth": "on" if self.auth else "off",
                "api_token": SecretStr(self.operator_token),
            }
        )

    def client(self, timeout: float = 10.0) -> httpx.Client:
        """An HTTP client for this deployment's services, sending the operator's credential."""
        return httpx.Client(headers=self.headers, timeout=timeout, verify=self.verify)

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"

    @property
    def verify(self) -> ssl.SSLContext | bool:
        """How httpx verifies this deployment's services: with `tls_ca` when given."""
        return ssl.create_default_context(cafile=self.tls_ca) if self.tls_ca else True

    def credential(self, role: Role, ident: str) -> str:
        """The credential (MEGHA_CREDENTIAL) of this deployment's service (`role`, `ident`)."""
        return Credential.issue(self.cluster_secret, role, ident).encode()

    def headers_as(self, role: Role, ident: str) -> dict[str, str]:
        """The Authorization header of service (`role`, `ident`) of this deployment (a test acting as it)."""
        return {"Authorization": Signer(Credential.issue(self.cluster_secret, role, ident)).header()}

    def _env(self, credential: str, **values: object) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in INHERITED_SECRETS}
        env.update({"MEGHA_AMQP_URL": self.amqp_url, "MEGHA_RUN_ID": self.run_id, "MEGHA_LOG_LEVEL": "info"})
        env["MEGHA_AUTH"] = "on" if self.auth else "off"
        if self.auth:  # a service's own credential, and the users' tokens as digests: no service holds the root
            tokens = {OPERATOR: self.operator_token, **self.user_tokens}
            env["MEGHA_CREDENTIAL"] = credential
            env["MEGHA_API_TOKENS"] = ",".join(f"{user}={token_digest(token)}" for user, token in tokens.items())
            env["MEGHA_OPERATORS"] = OPERATOR
        env.update({"MEGHA_TLS_CERT": self.tls_cert, "MEGHA_TLS_KEY": self.tls_key, "MEGHA_TLS_CA": self.tls_ca})
        env.update({f"MEGHA_{k.upper()}": str(v) for k, v in values.items()})
        return env

    def _spawn(self, name: str, module: str, port: int, **values: object) -> str:
        url = f"{self.scheme}://127.0.0.1:{port}"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.chmod(0o700)  # the operators': the LMs' and agents' logs quote failed tasks' stderr tails
        log = self.log_dir / f"{name}.log"
        role = module.rsplit(".", 1)[-1]
        amqp_url = self.amqp_urls.get(role, self.amqp_url)  # the role's user, if it has one
        ident = str(values.get("worker_id", values.get("lm_id", values.get("gm_id"))))
        credential = self.credential(role, ident) if self.auth else ""  # type: ignore[arg-type]
        command = [sys.executable, "-m", module]
        env = self._env(credential, port=port, public_url=url, amqp_url=amqp_url, **values)
        self.processes.append(Process(name, url, _popen(command, env, log), log, command, env))
        return url

    def process(self, name: str) -> Process:
        return next(p for p in self.processes if p.name == name)

    def kill(self, name: str) -> None:
        """SIGKILL a service and its task processes (a crash: no clean shutdown)."""
        proc = self.process(name)
        _signal_group(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait()

    def restart(self, name: str) -> None:
        """Start a killed (or stopped) service again with the same settings, appending to its log."""
        proc = self.process(name)
        if proc.popen.poll() is None:
            raise RuntimeError(f"{name} is still running")
        port = int(proc.url.rsplit(":", 1)[1])
        deadline = time.monotonic() + 30
        while not _bindable(port) and time.monotonic() < deadline:
            time.sleep(0.2)  # a socket of the killed process, or another program, holds it for now
        proc.popen = _popen(proc.command, proc.env, proc.log, append=True)

    def pause(self, name: str) -> None:
        """SIGSTOP a service (a stall: it holds its connections but answers nothing)."""
        _signal_group(self.process(name).popen.pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        _signal_group(self.process(name).popen.pid, signal.SIGCONT)

    def start(self) -> None:
        lm_urls = []
        for lm in range(self.lms):
            lm_urls.append(
                self._spawn(
                    f"lm-{lm}",
                    "megha.services.lm",
                    free_port(),
                    lm_id=lm,
                    num_gms=self.gms,
                    expected_nodes=self.workers_per_lm * self.nodes_per_worker,
                    delta_interval=self.delta_interval,
                    worker_timeout=self.worker_timeout,
                    queues=self.queues,
                    share_policy=self.share_policy,
                )
            )
            for w in range(self.workers_per_lm):
                extra: dict[str, object] = (
                    {"constraints": ALL_CONSTRAINTS}
                    if self.constraint_seed is None
                    else {"constraint_seed": self.constraint_seed * 1000 + lm * 100 + w}
                )
                values: dict[str, object] = {
                    "worker_id": f"worker-{lm}-{w}",
                    "lm_url": lm_urls[-1],
                    "execution": self.execution,
                    "nodes": self.nodes_per_worker,
                    "node_cpu_millicores": self.node_cpu_millicores,
                    "node_memory_mb": self.node_memory_mb,
                    "heartbeat_interval": self.heartbeat_interval,
                }
                # An agent's own settings win over the deployment's (unlike nodes: another node_cpu_millicores).
                self._spawn(
                    f"worker-{lm}-{w}",
                    "megha.services.worker",
                    free_port(),
                    **values | extra | self.worker_settings.get(f"worker-{lm}-{w}", {}),
                )
        ports: list[int] = []
        while len(ports) < self.gms:  # known before any GM starts: each GM is told its peers
            port = free_port()
            if port not in ports:
                ports.append(port)
        gm_urls = [f"{self.scheme}://127.0.0.1:{port}" for port in ports]
        self.gm_urls = [
            self._spawn(
                f"gm-{gm}",
                "megha.services.gm",
                ports[gm],
                gm_id=gm,
                lm_urls=",".join(lm_urls),
                gm_urls=",".join(gm_urls),
                takeover_after=self.takeover_after,
                queues=self.queues,
                share_policy=self.share_policy,
                journal_dir=self.log_dir.parent / "journal",
                **self.gm_settings,
            )
            for gm in range(self.gms)
        ]
        self.lm_urls = lm_urls

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Until every service answers /healthz as ready; a service that exits fails fast with its log."""
        deadline = time.monotonic() + timeout
        waiting = list(self.processes)
        while waiting:
            for proc in list(waiting):
                if proc.popen.poll() is not None:
                    raise RuntimeError(
                        f"{proc.name} exited with {proc.popen.returncode}; see {proc.log}:\n"
                        + proc.log.read_text()[-2000:]
                    )
                try:
                    body = httpx.get(f"{proc.url}/healthz", timeout=1.0, verify=self.verify).json()
                except httpx.HTTPError:
                    continue
                if not _answers_as(proc.name, body):
                    raise RuntimeError(f"{proc.url} answers as another service ({body}), not as {proc.name}")
                if body.get("ready", body.get("registered", True)):
                    waiting.remove(proc)
            if waiting and time.monotonic() > deadline:
                raise TimeoutError(f"not healthy after {timeout} s: {[p.name for p in waiting]}")
            time.sleep(0.1)

    def lm_states(self) -> list[dict[str, object]]:
        with self.client(5.0) as http:
            return [http.get(f"{url}/v1/state").json() for url in self.lm_urls]

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every process group, then SIGKILL what is left after `grace` seconds: no orphans."""
        for proc in self.processes:
            if proc.popen.poll() is None:
                _signal_group(proc.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(max(0.0, deadline - time.monotonic()))
            _signal_group(proc.popen.pid, signal.SIGKILL)
            proc.popen.wait()
        self.processes.clear()
        with contextlib.suppress(Exception):  # a broker that is away keeps them; nothing else depends on it
            asyncio.run(self._delete_run())

    async def _delete_run(self) -> None:
        """Remove the run's queues and exchanges from the broker: a finished run leaves nothing behind."""
        broker = Broker(self.amqp_url, self.run_id, connect_timeout=3.0, tls_ca=self.tls_ca or None)
        await broker.connect()
        try:
            keys = [gm_key(g) for g in range(self.gms)] + [lm_key(lm) for lm in range(self.lms)]
            await broker.delete_run(keys)
        finally:
            await broker.close(flush_timeout=0.5)

    def bring_up(self) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C stops us even if started ignoring it
        if self.own_broker:
            self._start_own_broker()
        self.start()
        self.wait_healthy()

    def tear_down(self) -> None:
        try:
            self.stop()
        finally:
            self._broker.close()  # the run's own broker node, if it has one, after its queues were removed

    def _start_own_broker(self) -> None:
        """Point the services at a RabbitMQ node of the run's own (deploy/run_broker.py), removed by `tear_down`;
        where this machine cannot start one, say so on stderr and use `amqp_url`."""
        from megha.deploy.run_broker import run_broker

        try:
            broker = self._broker.enter_context(run_broker(self.run_id))
        except (RuntimeError, TimeoutError, OSError, subprocess.SubprocessError) as exc:  # none here: amqp_url's
            print(
                f"megha local: WARNING: no RabbitMQ node of its own ({exc}); this run uses the broker at its "
                f"--amqp-url{guest_risk(self.amqp_url)}",
                file=sys.stderr,
            )
            check_broker(self.amqp_url, self.tls_ca)
            return
        self.amqp_url, self.amqp_urls = broker.admin_url, broker.urls


def _bindable(port: int) -> bool:
    """True when a server could listen on `port` now (as uvicorn does: closed connections in TIME_WAIT allowed)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _popen(command: list[str], env: dict[str, str], log: Path, append: bool = False) -> subprocess.Popen[bytes]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(log, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a log an earlier run of this folder made under a wider umask too
        return subprocess.Popen(
            command,
            env=env,
            stdout=fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopping it also stops its task processes
        )
    finally:
        os.close(fd)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


class BrokerUnreachable(ValueError):
    """No AMQP broker answers at a deployment's URL, or it refuses the login (the message hides the password)."""


def check_broker(url: str, tls_ca: str = "", timeout: float = 5.0) -> None:
    """BrokerUnreachable, one line without the password, when no AMQP broker answers at `url` within `timeout`
    seconds or it refuses the login: checked before any service starts (each would otherwise wait a minute)."""
    import aio_pika

    from megha.common.transport.rabbit import safe_url

    async def attempt() -> None:
        context = ssl.create_default_context(cafile=tls_ca or None) if url.startswith("amqps:") else None
        connection = await aio_pika.connect(url, timeout=timeout, ssl_context=context)
        await connection.close()

    loggers = [logging.getLogger(name) for name in ("aio_pika", "aiormq")]  # the one line below says it all
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        asyncio.run(asyncio.wait_for(attempt(), timeout + 1.0))
    except Exception as exc:  # aiormq raises a variety of socket, TLS and AMQP errors
        password = urlsplit(url).password
        reason = " ".join((str(exc) or type(exc).__name__).split())
        if password:
            reason = reason.replace(password, "***")
        raise BrokerUnreachable(f"cannot reach or log in to the AMQP broker at {safe_url(url)}: {reason}") from None
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def run_local(
    deployment: LocalDeployment, settings: LoadgenSettings, progress: Progress | None = None
) -> tuple[ServicesRun, list[dict[str, object]]]:
    """Start the deployment, replay, and return the run and every LM's final state; `progress` says what runs and,
    on a terminal, shows a bar of the tasks ended with the time left. A broker that cannot be reached or refuses
    the login is `BrokerUnreachable` before any service starts."""
    if not deployment.own_broker:  # a node of its own is started, or else this one checked, by `bring_up`
        check_broker(deployment.amqp_url, deployment.tls_ca)
    with deployment:
        settings = deployment.loadgen(settings)
        run = asyncio.run(replay_services(settings, progress))
        time.sleep(0.2)  # let the last worker reports reach the LMs
        states = deployment.lm_states()
    return run, states


def guest_risk(url: str) -> str:
    """What running users' tasks against the broker at `url` risks, as the end of a warning ("" when its user is not
    RabbitMQ's `guest`)."""
    if urlsplit(url).username != "guest":
        return ""
    return (
        ", as guest, which every exec task of the run can log in as too and so publish deltas and completions to "
        "the GMs or delete the run's queues (docs/security.md, Broker users)"
    )


def _answers_as(name: str, health: dict[str, object]) -> bool:
    """Whether a `/healthz` answer is that of the service `name` started as (gm-<i>, lm-<i>, or a worker agent's
    name): not of another service holding its port."""
    role, _, ident = name.partition("-")
    if role in ("gm", "lm"):
        return str(health.get(role)) == ident
    if role == "worker":
        return health.get("worker") == name
    return True
