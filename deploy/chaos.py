"""`megha chaos`: the chaos matrix. Each trial starts a RabbitMQ node of its own and a deployment of separate
processes (2 GMs x 2 LMs x 2 agents by default, simulated execution), replays a trace that keeps tasks queued in
the GMs, injects one fault once the GMs hold a backlog, and records what became of every accepted task:
finished exactly once, failed with a reason, lost (neither), or finished more than once; and how long after the
fault cleared every node was usable again (every LM ready with no node out of service, every GM answering).

    megha chaos                                   # every fault, one trial each
    megha chaos --faults gm-kill,broker-60 --trials 10 --out out/chaos

docs/reliability.md holds the table of 10 trials per fault and the command that made it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from megha.common.settings import LoadgenSettings
from megha.deploy.broker_node import BrokerNode
from megha.deploy.local import LocalDeployment
from megha.loadgen.services import ServicesRun, replay_services


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    inject: Callable[[LocalDeployment, BrokerNode], None]  # returns once the fault has cleared


def _kill_restart(name: str, down: float) -> Callable[[LocalDeployment, BrokerNode], None]:
    def inject(deployment: LocalDeployment, node: BrokerNode) -> None:
        deployment.kill(name)
        time.sleep(down)
        deployment.restart(name)

    return inject


def _broker_down(down: float) -> Callable[[LocalDeployment, BrokerNode], None]:
    def inject(deployment: LocalDeployment, node: BrokerNode) -> None:
        node.kill()
        time.sleep(down)
        node.start()

    return inject


def _stall(name: str, seconds: float) -> Callable[[LocalDeployment, BrokerNode], None]:
    def inject(deployment: LocalDeployment, node: BrokerNode) -> None:
        deployment.pause(name)
        try:
            time.sleep(seconds)
        finally:
            deployment.resume(name)

    return inject


def _partition(name: str, seconds: float) -> Callable[[LocalDeployment, BrokerNode], None]:
    """Cut a service off: nothing reaches its HTTP port, and its connections to the broker carry nothing
    (iptables DROP rules on this host's loopback, removed afterwards)."""

    def inject(deployment: LocalDeployment, node: BrokerNode) -> None:
        proc = deployment.process(name)
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


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault("gm-kill", "GM 0 killed (SIGKILL), restarted 5 s later", _kill_restart("gm-0", 5.0)),
        Fault("lm-kill", "LM 0 killed (SIGKILL), restarted 5 s later", _kill_restart("lm-0", 5.0)),
        Fault("agent-kill", "agent worker-0-0 killed (SIGKILL), restarted 5 s later", _kill_restart("worker-0-0", 5.0)),
        Fault("broker-5", "RabbitMQ killed (SIGKILL), started again 5 s later", _broker_down(5.0)),
        Fault("broker-60", "RabbitMQ killed (SIGKILL), started again 60 s later", _broker_down(60.0)),
        Fault(
            "lm-partition", "LM 0 cut off (HTTP port and broker connections dropped) for 30 s", _partition("lm-0", 30)
        ),
        Fault("gm-stall", "GM 0 stopped (SIGSTOP) for 30 s, then continued", _stall("gm-0", 30.0)),
    )
}


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
    out: Path = Path("out/chaos")

    @property
    def recovery_target(self) -> float:
        """The issue's target: every node usable within 2 x (worker timeout + delta interval) of the fault."""
        return 2 * (self.worker_timeout + self.delta_interval)


def run_trial(config: ChaosConfig, fault: Fault, trial: int, say: Callable[[str], None]) -> Trial:
    logs = config.out / "logs" / f"{fault.name}-{trial}"
    with BrokerNode() as node:
        deployment = LocalDeployment(
            gms=config.gms,
            lms=config.lms,
            workers_per_lm=config.workers_per_lm,
            nodes_per_worker=config.nodes_per_worker,
            execution="simulated",
            amqp_url=node.url,
            log_dir=logs,
            delta_interval=config.delta_interval,
            heartbeat_interval=config.heartbeat_interval,
            worker_timeout=config.worker_timeout,
        )
        recovered: list[float] = []
        errors: list[BaseException] = []

        def inject() -> None:
            try:
                _wait(lambda: _backlog(deployment) > 0, 120)
                say(f"  {fault.name}: injecting ({fault.what})")
                fault.inject(deployment, node)
                cleared = time.monotonic()
                usable = _wait(lambda: _all_usable(deployment), 120)
                recovered.append(usable - cleared if usable is not None else float("inf"))
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)

        with deployment:
            settings = LoadgenSettings(
                trace=config.trace,
                time_scale=config.time_scale,
                mode="slot",
                gm_urls=deployment.gm_urls,
                run_id=deployment.run_id,
                amqp_url=node.url,
                timeout=300.0,
            )
            injector = threading.Thread(target=inject)
            injector.start()
            run = asyncio.run(replay_services(settings))
            injector.join()
            if errors:
                raise RuntimeError(f"{fault.name}: injecting failed: {errors[0]}") from errors[0]
    return _tally(fault.name, trial, run, recovered[0])


def _tally(fault: str, trial: int, run: ServicesRun, recovery: float) -> Trial:
    accepted = [r for r in run.tasks.values() if not run.jobs[r.job_id].rejected_reason]
    timed_out = set(run.timed_out)
    finished_once = sum(r.completions == 1 for r in accepted)
    duplicated = sum(r.completions > 1 for r in accepted)
    failed = sum(r.completions == 0 and bool(r.failed_reason) and r.task_id not in timed_out for r in accepted)
    lost = len(accepted) - finished_once - duplicated - failed
    return Trial(fault, trial, len(accepted), finished_once, failed, lost, duplicated, recovery, run.wall_seconds)


def _wait(condition: Callable[[], bool], timeout: float) -> float | None:
    """The monotonic time `condition` first held, or None if it did not within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            if condition():
                return time.monotonic()
        time.sleep(0.2)
    return None


def _backlog(deployment: LocalDeployment) -> int:
    states = [httpx.get(f"{url}/v1/state", timeout=2.0).json() for url in deployment.gm_urls]
    return sum(int(s["queued"]) + int(s["waiting"]) for s in states)


def _all_usable(deployment: LocalDeployment) -> bool:
    for url in deployment.gm_urls:
        if not httpx.get(f"{url}/healthz", timeout=2.0).json()["ready"]:
            return False
    return all(s["ready"] and not s["down_nodes"] for s in deployment.lm_states())


def table(trials: list[Trial], target: float) -> str:
    """The chaos matrix as a markdown table: one row per fault, summed over its trials."""
    lines = [
        "| fault | trials | accepted | finished once | failed with reason | lost | counted twice | "
        f"usable again after (median / max s; target {target:g} s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in dict.fromkeys(t.fault for t in trials):
        rows = [t for t in trials if t.fault == name]
        rec = [t.recovery_seconds for t in rows]
        lines.append(
            f"| {name} | {len(rows)} | {sum(t.accepted for t in rows)} | {sum(t.finished_once for t in rows)} | "
            f"{sum(t.failed_with_reason for t in rows)} | {sum(t.lost for t in rows)} | "
            f"{sum(t.duplicated for t in rows)} | {statistics.median(rec):.1f} / {max(rec):.1f} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="megha chaos",
        description="The chaos matrix: replay a trace through real processes and a RabbitMQ node of their own, "
        "inject each fault, and count what became of every accepted task.",
    )
    parser.add_argument(
        "--faults",
        default="all",
        help=f"comma-separated, or all (default): {', '.join(FAULTS)}",
    )
    parser.add_argument("--trials", type=int, default=1, help="trials per fault (default: 1)")
    parser.add_argument("--trace", default=ChaosConfig.trace, help="trace to replay (default: %(default)s)")
    parser.add_argument("--time-scale", type=float, default=ChaosConfig.time_scale, help="default: %(default)s")
    parser.add_argument("--out", type=Path, default=ChaosConfig.out, help="results and logs (default: %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = list(FAULTS) if args.faults == "all" else [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = [n for n in names if n not in FAULTS]
    if unknown or args.trials < 1:
        print(
            f"megha chaos: error: unknown faults {unknown} (known: {', '.join(FAULTS)})"
            if unknown
            else "megha chaos: error: --trials must be at least 1",
            file=sys.stderr,
        )
        return 2
    config = ChaosConfig(trace=args.trace, time_scale=args.time_scale, out=args.out)
    config.out.mkdir(parents=True, exist_ok=True)
    # The load generator runs in this process: its broker client says what it waits for; aio-pika's own
    # reconnection attempts would repeat it every second.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    for noisy in ("aio_pika", "aiormq"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    trials: list[Trial] = []
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    with (config.out / "trials.jsonl").open("a") as log:
        for name in names:
            for k in range(1, args.trials + 1):
                say(f"{name}, trial {k}/{args.trials}")
                trial = run_trial(config, FAULTS[name], k, say)
                trials.append(trial)
                log.write(json.dumps(asdict(trial)) + "\n")
                log.flush()
                say(f"  {trial}")
    result = table(trials, config.recovery_target)
    (config.out / "matrix.md").write_text(result + "\n")
    print(result)
    bad = [t for t in trials if t.lost or t.duplicated or t.recovery_seconds > config.recovery_target]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
