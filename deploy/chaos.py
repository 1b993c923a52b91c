"""`megha chaos`: the chaos matrix. Each trial starts a deployment of its own (2 GMs x 2 LMs x 2 agents by
default, simulated execution, and a RabbitMQ node), replays a trace that keeps tasks queued in the GMs, injects
one fault once the GMs hold a backlog, and records what became of every accepted task: finished exactly once,
failed with a reason, lost (neither), or finished more than once; and how long after the fault cleared every
node was usable again (every LM ready with no node out of service, every GM answering).

Two backends run the same matrix: `processes` (separate processes on this host and a RabbitMQ node of the
trial's own; faults are signals and iptables rules) and `containers` (a container per service on a Docker
network of the trial's own, deploy/containers.py; faults are docker kill, restart, pause and network disconnect).

    megha chaos                                   # every fault of the process backend, one trial each
    megha chaos --faults gm-kill,broker-60 --trials 10 --out out/chaos
    megha chaos --backend containers --trials 10  # needs the images of deploy/images/build.sh

docs/reliability.md holds the tables of 10 trials per fault and the commands that made them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import httpx

from megha.common.settings import LoadgenSettings
from megha.common.usage import OneLineParser
from megha.deploy.broker_node import BrokerNode, broker_node
from megha.deploy.containers import ContainerDeployment, DockerError, docker
from megha.deploy.local import LocalDeployment
from megha.loadgen.records import TaskRecord
from megha.loadgen.services import ServicesRun, replay_services


class Target(Protocol):
    """A running deployment as the matrix sees it: where this host reaches its GMs, LMs and broker."""

    @property
    def gm_urls(self) -> list[str]: ...

    @property
    def lm_urls(self) -> list[str]: ...

    @property
    def run_id(self) -> str: ...

    @property
    def amqp_url(self) -> str: ...

    @property
    def operator_token(self) -> str: ...

    @property
    def headers(self) -> dict[str, str]: ...


T = TypeVar("T", bound=Target)


@dataclass(frozen=True)
class Fault(Generic[T]):
    name: str
    what: str
    inject: Callable[[T], None]  # returns once the fault has cleared
    gangs: float = 0.0  # the fraction of the trial's jobs submitted as gangs (MEGHA_GANGS)
    trace: str | None = None  # the trial's trace, when not the matrix's (gangs must fit the deployment)


@dataclass(frozen=True)
class Backend(Generic[T]):
    name: str
    faults: dict[str, Fault[T]]
    deploy: Callable[[ChaosConfig, Path], AbstractContextManager[T]]  # a running deployment, logs in the path


# ------------------------------------------------------------------------------------------- processes backend


@dataclass
class Processes:
    """The process backend's deployment: separate processes on this host and a RabbitMQ node of their own
    (`rabbitmq-server`, or a container of the RabbitMQ image where it is not installed: deploy/broker_node.py)."""

    deployment: LocalDeployment
    node: BrokerNode

    @property
    def gm_urls(self) -> list[str]:
        return self.deployment.gm_urls

    @property
    def lm_urls(self) -> list[str]:
        return self.deployment.lm_urls

    @property
    def run_id(self) -> str:
        return self.deployment.run_id

    @property
    def amqp_url(self) -> str:
        return self.node.url

    @property
    def operator_token(self) -> str:
        return self.deployment.operator_token

    @property
    def headers(self) -> dict[str, str]:
        return self.deployment.headers


@contextlib.contextmanager
def _processes(config: ChaosConfig, logs: Path) -> Iterator[Processes]:
    with broker_node() as node:
        deployment = LocalDeployment(**config.deployment_shape(), amqp_url=node.url, log_dir=logs)
        with deployment:
            yield Processes(deployment, node)


def _kill_restart(name: str, down: float) -> Callable[[Processes], None]:
    def inject(target: Processes) -> None:
        target.deployment.kill(name)
        time.sleep(down)
        target.deployment.restart(name)

    return inject


def _broker_down(down: float) -> Callable[[Processes], None]:
    def inject(target: Processes) -> None:
        target.node.kill()
        time.sleep(down)
        target.node.start()

    return inject


def _kill_all(names: tuple[str, ...], down: float) -> Callable[[Processes], None]:
    """SIGKILL every service of `names` and the broker at once, and start them all again `down` seconds later (the
    broker first): one of each component lost together."""

    def inject(target: Processes) -> None:
        for name in names:
            target.deployment.kill(name)
        target.node.kill()
        time.sleep(down)
        target.node.start()
        for name in names:
            target.deployment.restart(name)

    return inject


def _stall(name: str, seconds: float) -> Callable[[Processes], None]:
    def inject(target: Processes) -> None:
        target.deployment.pause(name)
        try:
            time.sleep(seconds)
        finally:
            target.deployment.resume(name)

    return inject


def _stall_until_lost(agent: str, lm: int) -> Callable[[Processes], None]:
    """Stop (SIGSTOP) an agent until its LM (`lm`) has taken it out of service and reported its runs lost, then
    continue it at once: it comes back while its GMs run those tasks again, with the ends of the lost runs still
    to send. A stop the LM has not acted on within 60 s fails the trial."""

    def inject(target: Processes) -> None:
        target.deployment.pause(agent)
        try:
            with httpx.Client(headers=target.headers, timeout=2.0) as http:

                def lost() -> bool:
                    with contextlib.suppress(httpx.HTTPError, ValueError):
                        return agent in http.get(f"{target.lm_urls[lm]}/v1/state").json().get("lost_workers", {})
                    return False

                if _wait(lost, 60) is None:
                    raise TimeoutError(f"LM {lm} did not take {agent} out of service within 60 s")
        finally:
            target.deployment.resume(agent)

    return inject


def _partition(name: str, seconds: float) -> Callable[[Processes], None]:
    """Cut a service off: nothing reaches its HTTP port, and its connections to the broker carry nothing
    (iptables DROP rules on this host's loopback, removed afterwards)."""

    def inject(target: Processes) -> None:
        proc, node = target.deployment.process(name), target.node
        port = int(proc.url.rsplit(":", 1)[1])
        amqp_ports = _client_ports(proc.popen.pid, node.port)
        rules = [["-p", "tcp", "--dport", str(port)], ["-p", "tcp", "--sport", str(port)]]
        rules += [["-p", "tcp", "--sport", str(p), "--dport", str(node.port)] for p in amqp_ports]
        rules += [["-p", "tcp", "--sport", str(node.port), "--dport", str(p)] for p in amqp_ports]
        for rule in rules:
            subprocess.run(["iptables", "-I", "INPUT", *rule, "-j", "DROP"], check=True, timeout=10)
        try:
            time.sleep(seconds)
        finally:
            for rule in rules:
                subprocess.run(["iptables", "-D", "INPUT", *rule, "-j", "DROP"], check=False, timeout=10)

    return inject


def _client_ports(pid: int, server_port: int) -> list[int]:
    """Local ports of process `pid`'s TCP connections to 127.0.0.1:`server_port`."""
    out = subprocess.run(
        ["ss", "-tnpH", "state", "established", f"( dport = :{server_port} )"],
        capture_output=True,
        text=True,
        timeout=10,
    ).stdout
    return [int(line.split()[2].rsplit(":", 1)[1]) for line in out.splitlines() if f"pid={pid}," in line]


GANG_TRACE = "syn:6:75"
"""The gang faults' load: 75 jobs of 6 tasks (450 tasks, as the matrix's trace), half of them gangs. A slot-mode task
holds a whole node and an LM of the chaos deployment has 4, so every gang spans both LMs (prepare, then commit);
6 tasks of 0.25 s every 0.25 s on 8 nodes keep gangs waiting for room, so that prepares keep coming."""


def _gang_kill(victim: str, down: float) -> Callable[[Processes], None]:
    """SIGKILL a GM (victim "gm") or an LM (victim "lm") while a gang is between prepare and commit, and restart it
    `down` seconds later. The LMs' `GET /v1/state` is polled for a gang part held prepared under a lease; once one
    is seen, its GM is stopped (SIGSTOP) so that no commit (or abort) goes out, and after the calls in flight have
    landed the LM is asked again: if the lease is still held, the gang is between prepare and commit for as long
    as the GM stays stopped. Then "gm": that GM is killed (its leases are left to expire, or to be replaced by its
    recovered self's prepares); "lm": the lowest LM holding the gang's lease is killed and the GM continued, so
    that it commits to a dead LM. For its first 15 s the watch waits for a gang every LM of which holds its part
    prepared: the moment the commits would go out, when a lost LM can leave another LM's part launched alone. A
    lease gone by the time it is asked again (committed or aborted), or in those 15 s held at one LM only,
    continues the GM and the watch goes on (up to two minutes)."""

    def inject(target: Processes) -> None:
        deployment = target.deployment
        with httpx.Client(headers=target.headers, timeout=2.0) as http:

            def leases() -> dict[int, list[dict[str, Any]]]:
                held: dict[int, list[dict[str, Any]]] = {}
                for lm, url in enumerate(target.lm_urls):
                    with contextlib.suppress(httpx.HTTPError, ValueError):
                        held[lm] = http.get(f"{url}/v1/state").json().get("gang_leases", [])
                return held

            prefer_whole_until = time.monotonic() + 15  # the replay lasts about 25 s
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                seen = [(lm, lease) for lm, ls in leases().items() for lease in ls if lease["expires_in"] > 1.0]
                if not seen:
                    continue
                gm = f"gm-{seen[0][1]['gm']}"
                deployment.pause(gm)
                killed = False
                try:
                    time.sleep(0.2)  # the GM's calls already sent land (or fail) meanwhile
                    held = leases()
                    still = {
                        (lm, lease["gang"], lease["seq"])
                        for lm, ls in held.items()
                        for lease in ls
                        if f"gm-{lease['gm']}" == gm and lease["expires_in"] > 0.5
                    }
                    by_gang: dict[str, list[int]] = {}
                    for lm, gang, _ in sorted(still):
                        by_gang.setdefault(gang, []).append(lm)
                    whole = [lms for lms in by_gang.values() if len(lms) == len(target.lm_urls)]
                    if not still or (not whole and time.monotonic() < prefer_whole_until):
                        continue
                    say = f"{'' if whole else 'not '}prepared at every LM"
                    if victim == "gm":
                        deployment.kill(gm)
                        killed = True
                        name = gm
                    else:
                        name = f"lm-{(whole or list(by_gang.values()))[0][0]}"
                        deployment.kill(name)
                    print(f"  killed {name}, gang leases held ({say}): {sorted(still)}", file=sys.stderr, flush=True)
                finally:
                    if not killed:
                        deployment.resume(gm)
                time.sleep(down)
                deployment.restart(name)
                return
            raise TimeoutError("no gang was seen between prepare and commit within 120 s")

    return inject


PROCESS_FAULTS: dict[str, Fault[Processes]] = {
    f.name: f
    for f in (
        Fault("gm-kill", "GM 0 killed (SIGKILL), restarted 5 s later", _kill_restart("gm-0", 5.0)),
        Fault("lm-kill", "LM 0 killed (SIGKILL), restarted 5 s later", _kill_restart("lm-0", 5.0)),
        Fault("agent-kill", "agent worker-0-0 killed (SIGKILL), restarted 5 s later", _kill_restart("worker-0-0", 5.0)),
        Fault("broker-5", "RabbitMQ killed (SIGKILL), started again 5 s later", _broker_down(5.0)),
        Fault("broker-60", "RabbitMQ killed (SIGKILL), started again 60 s later", _broker_down(60.0)),
        Fault(
            "all-kill",
            "GM 0, LM 0, its agent worker-0-0 and RabbitMQ killed (SIGKILL) at once, all started again 5 s later",
            _kill_all(("gm-0", "lm-0", "worker-0-0"), 5.0),
        ),
        Fault(
            "lm-partition", "LM 0 cut off (HTTP port and broker connections dropped) for 30 s", _partition("lm-0", 30)
        ),
        Fault("gm-stall", "GM 0 stopped (SIGSTOP) for 30 s, then continued", _stall("gm-0", 30.0)),
        Fault("lm-stall", "LM 0 stopped (SIGSTOP) for 30 s, then continued", _stall("lm-0", 30.0)),
        Fault(
            "agent-stall",
            "agent worker-0-0 stopped (SIGSTOP) until LM 0 reports its runs lost, then continued",
            _stall_until_lost("worker-0-0", 0),
        ),
        Fault(
            "gm-down",
            "GM 0 killed (SIGKILL), restarted 60 s later: GM 1 stands in for it after 45 s, then hands it back",
            _kill_restart("gm-0", 60.0),
        ),
        Fault(
            "gang-gm-kill",
            "a GM killed (SIGKILL) while LMs hold its gang prepared and it has not committed, restarted 5 s later",
            _gang_kill("gm", 5.0),
            gangs=0.5,
            trace=GANG_TRACE,
        ),
        Fault(
            "gang-lm-kill",
            "an LM killed (SIGKILL) while it holds a gang prepared and its GM has not committed, restarted 5 s later",
            _gang_kill("lm", 5.0),
            gangs=0.5,
            trace=GANG_TRACE,
        ),
    )
}

# ------------------------------------------------------------------------------------------ containers backend


@contextlib.contextmanager
def _containers(config: ChaosConfig, logs: Path) -> Iterator[ContainerDeployment]:
    deployment = ContainerDeployment(**config.deployment_shape(), log_dir=logs)
    try:
        docker("image", "inspect", deployment.image, deployment.rabbitmq_image)
    except DockerError as exc:
        raise RuntimeError(f"{exc}\nbuild the images first: deploy/images/build.sh") from exc
    with deployment:
        yield deployment


def _docker_down(service: str, down: float, how: str) -> Callable[[ContainerDeployment], None]:
    """`docker kill` (how="kill") or `docker stop` (how="stop"), then `docker start` `down` seconds later."""

    def inject(target: ContainerDeployment) -> None:
        getattr(target, how)(service)
        time.sleep(down)
        target.start(service)

    return inject


def _docker_restart(service: str) -> Callable[[ContainerDeployment], None]:
    def inject(target: ContainerDeployment) -> None:
        target.restart(service)

    return inject


def _docker_undo(service: str, seconds: float, do: str, undo: str) -> Callable[[ContainerDeployment], None]:
    """`docker pause` / `network disconnect`, undone (`unpause` / `network connect`) `seconds` later."""

    def inject(target: ContainerDeployment) -> None:
        getattr(target, do)(service)
        try:
            time.sleep(seconds)
        finally:
            getattr(target, undo)(service)

    return inject


CONTAINER_FAULTS: dict[str, Fault[ContainerDeployment]] = {
    f.name: f
    for f in (
        Fault("gm-kill", "GM 0: docker kill, docker start 5 s later", _docker_down("gm-0", 5.0, "kill")),
        Fault("lm-kill", "LM 0: docker kill, docker start 5 s later", _docker_down("lm-0", 5.0, "kill")),
        Fault(
            "agent-kill",
            "agent worker-0-0: docker kill, docker start 5 s later",
            _docker_down("worker-0-0", 5.0, "kill"),
        ),
        Fault("broker-restart", "RabbitMQ: docker restart", _docker_restart("rabbitmq")),
        Fault("broker-60", "RabbitMQ: docker stop, docker start 60 s later", _docker_down("rabbitmq", 60.0, "stop")),
        Fault(
            "lm-partition",
            "LM 0: docker network disconnect, connect 30 s later",
            _docker_undo("lm-0", 30.0, "disconnect", "connect"),
        ),
        Fault(
            "gm-partition",
            "GM 0: docker network disconnect, connect 30 s later",
            _docker_undo("gm-0", 30.0, "disconnect", "connect"),
        ),
        Fault("gm-pause", "GM 0: docker pause, unpause 30 s later", _docker_undo("gm-0", 30.0, "pause", "unpause")),
        Fault("lm-pause", "LM 0: docker pause, unpause 30 s later", _docker_undo("lm-0", 30.0, "pause", "unpause")),
        Fault(
            "gm-down",
            "GM 0: docker kill, docker start 60 s later (GM 1 stands in for it after 45 s, then hands it back)",
            _docker_down("gm-0", 60.0, "kill"),
        ),
    )
}

BACKENDS: dict[str, Backend[Any]] = {
    "processes": Backend("processes", PROCESS_FAULTS, _processes),
    "containers": Backend("containers", CONTAINER_FAULTS, _containers),
}

# ---------------------------------------------------------------------------------------------- the matrix


@dataclass
class Trial:
    fault: str
    trial: int
    accepted: int
    finished_once: int
    failed_with_reason: int
    lost: int
    duplicated: int
    recovery_seconds: float
    wall_seconds: float
    gangs: int = 0  # accepted gang jobs
    partial_gangs: int = 0  # gang runs some task of which finished while another never started (docs/reliability.md)


@dataclass(frozen=True)
class ChaosConfig:
    gms: int = 2
    lms: int = 2
    workers_per_lm: int = 2
    nodes_per_worker: int = 2
    trace: str = "syn:50:9"
    time_scale: float = 0.25
    worker_timeout: float = 10.0
    heartbeat_interval: float = 0.5
    delta_interval: float = 1.0
    backend: str = "processes"
    out: Path = Path("out/chaos")

    def deployment_shape(self) -> dict[str, Any]:
        """The deployment every backend starts for a trial (simulated execution)."""
        return {
            "gms": self.gms,
            "lms": self.lms,
            "workers_per_lm": self.workers_per_lm,
            "nodes_per_worker": self.nodes_per_worker,
            "execution": "simulated",
            "delta_interval": self.delta_interval,
            "heartbeat_interval": self.heartbeat_interval,
            "worker_timeout": self.worker_timeout,
        }

    @property
    def recovery_target(self) -> float:
        """The issue's target: every node usable within 2 x (worker timeout + delta interval) of the fault."""
        return 2 * (self.worker_timeout + self.delta_interval)


def run_trial(config: ChaosConfig, fault_name: str, trial: int, say: Callable[[str], None]) -> Trial:
    """One trial of one fault of `config.backend`; the services' logs go to <out>/logs/<fault>-<trial>."""
    backend = BACKENDS[config.backend]
    fault = backend.faults[fault_name]
    logs = config.out / "logs" / f"{fault.name}-{trial}"
    with backend.deploy(config, logs) as target:
        recovered: list[float] = []
        errors: list[BaseException] = []

        def inject() -> None:
            try:
                if not fault.gangs:  # a gang fault waits for a gang between prepare and commit instead
                    _wait(lambda: _backlog(target) > 0, 120)
                say(f"  {fault.name}: injecting ({fault.what})")
                fault.inject(target)
                cleared = time.monotonic()
                usable = _wait(lambda: _all_usable(target), 120)
                recovered.append(usable - cleared if usable is not None else float("inf"))
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)

        settings = LoadgenSettings(
            trace=fault.trace or config.trace,
            gangs=fault.gangs,
            time_scale=config.time_scale,
            mode="slot",
            gm_urls=target.gm_urls,
            run_id=target.run_id,
            amqp_url=target.amqp_url,
            timeout=300.0,
            auth="on",  # both backends make their secrets
            api_token=target.operator_token,
        )
        injector = threading.Thread(target=inject)
        injector.start()
        try:
            run = asyncio.run(_replay_unless_failed(settings, errors))
        finally:
            injector.join()  # a fault is undone (a container unpaused, a partition lifted) before clean-up
        if errors or run is None:
            raise RuntimeError(f"{fault.name}: injecting failed: {errors[0]}") from errors[0]
        _keep_views(target, run, logs / "views.json")
    _keep_suspects(run, logs / "suspects.json")
    return _tally(fault.name, trial, run, recovered[0])


async def _replay_unless_failed(settings: LoadgenSettings, errors: list[BaseException]) -> ServicesRun | None:
    """The replay, abandoned (None) as soon as injecting the fault failed: a fault that did not clear (a broker
    that did not come back) fails the trial at once with its reason, rather than after the replay's timeout."""
    replay = asyncio.ensure_future(replay_services(settings))
    while not replay.done():
        if errors:
            replay.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await replay
            return None
        await asyncio.wait({replay}, timeout=0.5)
    return replay.result()


def _keep_suspects(run: ServicesRun, path: Path) -> None:
    """Write every task event of each accepted task that did not finish exactly once to `path`, beside the
    services' logs, so that a trial that lost or doubled a task can be traced (nothing when there is none)."""
    suspects = {
        r.task_id: {
            "completions": r.completions,
            "failed_reason": r.failed_reason,
            "events": [e.model_dump(mode="json") for e in run.events.get(r.task_id, [])],
        }
        for r in _suspects(run)
    }
    partial = {job for job, _ in _partial_gang_runs(run, sorted(run.gangs))}
    for r in run.tasks.values():  # every member of a gang that ran in part
        if r.job_id in partial:
            suspects[r.task_id] = {
                "completions": r.completions,
                "failed_reason": r.failed_reason,
                "gang ran in part": True,
                "events": [e.model_dump(mode="json") for e in run.events.get(r.task_id, [])],
            }
    if suspects:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(suspects, indent=1) + "\n")


def _suspects(run: ServicesRun) -> list[TaskRecord]:
    """The accepted tasks that did not finish exactly once."""
    return [r for r in run.tasks.values() if not run.jobs[r.job_id].rejected_reason and r.completions != 1]


def _keep_views(target: Target, run: ServicesRun, path: Path) -> None:
    """When a trial lost or doubled a task, write to `path` what the still running deployment says about it: each
    GM's status of the suspect jobs and its state, each LM's state and the runs it holds for each GM. This tells
    whether a task the load generator never saw end is still running at an LM, ended unseen by its GM, or waits
    in a GM's queue (nothing when every task finished once)."""
    jobs = {r.job_id for r in _suspects(run)}
    if not jobs:
        return

    def ask(url: str) -> Any:
        try:
            r = httpx.get(url, headers=target.headers, timeout=5.0)
        except httpx.HTTPError as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        try:
            return {"status": r.status_code, "body": r.json()}
        except ValueError:
            return {"status": r.status_code, "text": r.text[:2000]}

    views = {
        "gms": {
            url: {"state": ask(f"{url}/v1/state"), "jobs": {job: ask(f"{url}/v1/jobs/{job}") for job in sorted(jobs)}}
            for url in target.gm_urls
        },
        "lms": {
            url: {"state": ask(f"{url}/v1/state")}
            | {f"gm {gm}": ask(f"{url}/v1/gms/{gm}/state") for gm in range(len(target.gm_urls))}
            for url in target.lm_urls
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(views, indent=1) + "\n")


def _tally(fault: str, trial: int, run: ServicesRun, recovery: float) -> Trial:
    accepted = [r for r in run.tasks.values() if not run.jobs[r.job_id].rejected_reason]
    timed_out = set(run.timed_out)
    finished_once = sum(r.completions == 1 for r in accepted)
    duplicated = sum(r.completions > 1 for r in accepted)
    failed = sum(r.completions == 0 and bool(r.failed_reason) and r.task_id not in timed_out for r in accepted)
    lost = len(accepted) - finished_once - duplicated - failed
    gangs = [j for j in sorted(run.gangs) if not run.jobs[j].rejected_reason]
    partial = _partial_gang_runs(run, gangs)
    return Trial(
        fault,
        trial,
        len(accepted),
        finished_once,
        failed,
        lost,
        duplicated,
        recovery,
        run.wall_seconds,
        len(gangs),
        len(partial),
    )


def _partial_gang_runs(run: ServicesRun, gangs: list[str]) -> list[tuple[str, int]]:
    """The runs of gang jobs that ran to their end in part, as (job, attempt), from the task events alone.

    A gang runs as attempt k of every member that has not finished in an earlier attempt (docs/gang.md: a member
    that ran to its end is never run again; the rest run again together, as the next attempt of each). Run k of gang
    job J ran in part when some member has a `finished` event of attempt k while some member that had not finished
    before attempt k has no `started` event of attempt k. A part that launched in a crash and was stopped (no
    `finished` event of that attempt) is not a partial run: docs/gang.md allows it."""
    tasks_of: dict[str, list[str]] = {}
    for r in run.tasks.values():
        if r.job_id in run.gangs:
            tasks_of.setdefault(r.job_id, []).append(r.task_id)
    partial: list[tuple[str, int]] = []
    for job in gangs:
        started: dict[int, set[str]] = {}
        finished: dict[str, int] = {}  # task -> the attempt it first finished in
        for task in tasks_of.get(job, []):
            for e in run.events.get(task, []):
                if e.kind == "started":
                    started.setdefault(e.attempt, set()).add(task)
                elif e.kind == "finished":
                    finished[task] = min(finished.get(task, e.attempt), e.attempt)
        for k in sorted(set(finished.values())):
            members = {t for t in tasks_of[job] if finished.get(t, k) >= k}
            if not members <= started.get(k, set()):
                partial.append((job, k))
    return partial


def _wait(condition: Callable[[], bool], timeout: float) -> float | None:
    """The monotonic time `condition` first held, or None if it did not within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            if condition():
                return time.monotonic()
        time.sleep(0.2)
    return None


def _backlog(target: Target) -> int:
    states = [httpx.get(f"{url}/v1/state", headers=target.headers, timeout=2.0).json() for url in target.gm_urls]
    return sum(int(s["queued"]) + int(s["waiting"]) for s in states)


def _all_usable(target: Target) -> bool:
    for url in target.gm_urls:
        if not httpx.get(f"{url}/healthz", timeout=2.0).json()["ready"]:
            return False
    states = [httpx.get(f"{url}/v1/state", headers=target.headers, timeout=5.0).json() for url in target.lm_urls]
    return all(s["ready"] and not s["down_nodes"] for s in states)


def table(trials: list[Trial], target: float) -> str:
    """The chaos matrix as a markdown table: one row per fault, summed over its trials."""
    lines = [
        "| fault | trials | accepted | finished once | failed with reason | lost | counted twice | "
        f"usable again after (median / max s; target {target:g} s) | gang jobs | gangs run in part |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in dict.fromkeys(t.fault for t in trials):
        rows = [t for t in trials if t.fault == name]
        rec = [t.recovery_seconds for t in rows]
        lines.append(
            f"| {name} | {len(rows)} | {sum(t.accepted for t in rows)} | {sum(t.finished_once for t in rows)} | "
            f"{sum(t.failed_with_reason for t in rows)} | {sum(t.lost for t in rows)} | "
            f"{sum(t.duplicated for t in rows)} | {statistics.median(rec):.1f} / {max(rec):.1f} | "
            f"{sum(t.gangs for t in rows)} | {sum(t.partial_gangs for t in rows)} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="megha chaos",
        description="The chaos matrix: replay a trace through a deployment and a RabbitMQ node of its own, inject "
        "each fault, and count what became of every accepted task.",
    )
    parser.add_argument(
        "--backend",
        choices=list(BACKENDS),
        default="processes",
        help="processes: separate processes on this host (default); containers: a container per service on a "
        "Docker network of the trial's own (images from deploy/images/build.sh)",
    )
    parser.add_argument(
        "--faults",
        default="all",
        help="comma-separated, or all (default). "
        + "; ".join(f"{b.name}: {', '.join(b.faults)}" for b in BACKENDS.values()),
    )
    parser.add_argument("--trials", type=int, default=1, help="trials per fault (default: 1)")
    parser.add_argument("--trace", default=ChaosConfig.trace, help="trace to replay (default: %(default)s)")
    parser.add_argument("--time-scale", type=float, default=ChaosConfig.time_scale, help="default: %(default)s")
    parser.add_argument(
        "--out", type=Path, help="results and logs (default: out/chaos, or out/chaos-containers for containers)"
    )
    return parser


def _check_inputs(args: argparse.Namespace, faults: list[Any], out: Path) -> str | None:
    """What is wrong with the command line's inputs, in one line naming the option, or None: checked before any
    broker or deployment starts (a trial takes minutes to reach the trace)."""
    from megha.loadgen.trace import resolve_trace

    if not (math.isfinite(args.time_scale) and args.time_scale > 0):
        return f"--time-scale: must be a finite number > 0, got {args.time_scale}"
    for trace in dict.fromkeys([args.trace, *(f.trace for f in faults if f.trace)]):
        try:
            resolve_trace(trace, None, args.time_scale)
        except ValueError as exc:
            return f"--trace: {exc}"
    for folder in (out, *out.parents):
        if folder.exists():
            return None if folder.is_dir() else f"--out: {out} cannot be a folder: {folder} is a file"
    return None


def _quiet_after_interrupt() -> None:
    """After an interrupted trial, the broker client's callbacks still pending when its event loop was closed would
    each print a traceback as they are collected ("Task was destroyed but it is pending!"): the run is over and
    they say nothing about it, so they are not reported."""
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    sys.unraisablehook = lambda unraisable: None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    faults = BACKENDS[args.backend].faults
    names = list(faults) if args.faults == "all" else [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = [n for n in names if n not in faults]
    if unknown or args.trials < 1:
        print(
            f"megha chaos: error: unknown faults {unknown} for the {args.backend} backend (known: {', '.join(faults)})"
            if unknown
            else "megha chaos: error: --trials must be at least 1",
            file=sys.stderr,
        )
        return 2
    out = args.out or Path("out/chaos" if args.backend == "processes" else f"out/chaos-{args.backend}")
    problem = _check_inputs(args, [faults[n] for n in names], out)
    if problem:
        print(f"megha chaos: error: {problem}", file=sys.stderr)
        return 2
    config = ChaosConfig(trace=args.trace, time_scale=args.time_scale, backend=args.backend, out=out)
    config.out.mkdir(parents=True, exist_ok=True)
    # The load generator runs in this process: its broker client says what it waits for; aio-pika's own
    # reconnection attempts would repeat it every second.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    for noisy in ("aio_pika", "aiormq"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    trials: list[Trial] = []
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    # Round by round (trial k of every fault, then k + 1), so that a run cut short still covers every fault and a
    # busy spell of the machine does not fall on one fault's trials only.
    with (config.out / "trials.jsonl").open("a") as log:
        try:
            for k in range(1, args.trials + 1):
                for name in names:
                    say(f"{name}, trial {k}/{args.trials}")
                    trial = run_trial(config, name, k, say)
                    trials.append(trial)
                    log.write(json.dumps(asdict(trial)) + "\n")
                    log.flush()
                    say(f"  {trial}")
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (handled as Ctrl-C by the deployment): its services stopped
            _quiet_after_interrupt()
            say(f"interrupted: every service was stopped; {len(trials)} finished trials are in {log.name}")
            return 130
    result = table(trials, config.recovery_target)
    (config.out / "matrix.md").write_text(result + "\n")
    print(result)
    bad = [
        t for t in trials if t.lost or t.duplicated or t.partial_gangs or t.recovery_seconds > config.recovery_target
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
