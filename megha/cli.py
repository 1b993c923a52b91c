"""The `megha` command line: `megha replay` replays a trace through the embedded system and prints the report."""

from __future__ import annotations

import argparse
import platform
import sys
from importlib.metadata import version
from pathlib import Path

from megha.common.argtypes import non_negative_float, positive_float, positive_int
from megha.common.core.fairness.config import parse_queues
from megha.common.core.fairness.policy import SHARE_POLICIES
from megha.common.core.placement.choice import CHOICE_POLICIES
from megha.common.settings import GMSettings, LMSettings, LoadgenSettings, WorkerSettings, settings_help
from megha.embedded.faults import parse_faults
from megha.sim.system import SCHEDULERS

REPLAY_OUT = Path("out/replay")  # each run's report folder is a new <date>-<time> under it unless --out names one
LOCAL_OUT = Path("out/local")
REPLAY_EXAMPLES = """\
examples:
  megha replay                                   # 200 jobs of syn_250 on a generated 10,000-node cluster
  megha replay --trace ../shared/traces/syn_250.0.tr --first-jobs 200 --cluster reference
  megha replay --trace demo --mode scaled --no-constraints --lms 2 --gms 2 --workers-per-partition 20 \\
      --node-cpu 2000 --node-mem 4096
  megha replay --trace syn:500:100 --matching min-constraints --out out/syn500

output:
  The report goes to stdout; without --out, its files go to a new folder out/replay/<date>-<time> each run.
  An --out folder that already holds a report is refused unless --overwrite is given. On a terminal, stderr
  shows a progress bar with the time left (--quiet: nothing on stderr but errors and warnings).

exit status: 0 every task of an accepted job ended exactly once; 1 some task did not; 2 bad usage or input;
  3 most tasks failed or most jobs were rejected (a WARNING on stderr names the reasons)
"""
CTL_COMMANDS = {  # megha/ctl.py (click): they operate a running deployment; each has its own --help
    "job": "submit, show, list and cancel jobs at running GMs (megha job --help)",
    "queues": "each user queue of running GMs: share, usage, pending and running tasks",
    "nodes": "each partition of running LMs: nodes in and out of service, free and used resources",
    "top": "a live view of running GMs and LMs: tasks, jobs by state, free resources",
}
LOCAL_EPILOG = """\
output:
  The report goes to stdout (its times are wall-clock times); without --out, its files and the services' logs go
  to a new folder out/local/<date>-<time> each run. An --out folder that already holds a report is refused unless
  --overwrite is given. On a terminal, stderr shows a progress bar (tasks ended of tasks accepted) with the time
  left (--quiet: nothing on stderr but errors and warnings).

exit status: 0 every task of an accepted job ended exactly once and every LM is back to full capacity; 1 not so,
  or the replay timed out; 2 bad usage or input; 3 most tasks failed or most jobs were rejected (a WARNING on
  stderr names the reasons); 130 interrupted (every service was stopped)
"""


def _queues_arg(text: str) -> str:
    if not text:
        return text
    try:
        parse_queues(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="megha", description="Megha: a federated scheduler for data centres.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version('megha')}")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser(
        "replay",
        help="replay a trace through GMs, LMs and workers in one process (no broker, no network)",
        description="Replay a job trace through the embedded Megha system (GMs, LMs and simulated workers joined "
        "by an in-memory transport on a virtual clock) and report allocation time, JRT delay and utilization.",
        epilog=REPLAY_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    w = r.add_argument_group("workload")
    w.add_argument(
        "--trace",
        default="syn:250:200",
        help="a .tr file, 'demo' (100 jobs of the Google sub-trace, shipped), or syn:<tasks>:<jobs> "
        "(one job a second of <tasks> 1-second tasks) (default: %(default)s)",
    )
    w.add_argument("--first-jobs", type=positive_int, default=None, help="replay only the first N jobs")
    w.add_argument(
        "--time-scale",
        type=positive_float,
        default=1.0,
        help="multiply arrival times and durations by this factor (default: %(default)s)",
    )
    w.add_argument(
        "--mode",
        choices=("slot", "scaled"),
        default="slot",
        help="slot: each task holds a whole worker (constraint-aware study); scaled: Google-like "
        "requests scaled down 400x CPU / 50x memory (Megha prototype) (default: %(default)s)",
    )
    w.add_argument("--users", type=positive_int, default=1, help="users jobs are spread over (default: %(default)s)")
    w.add_argument(
        "--no-constraints",
        action="store_true",
        help="give tasks no placement constraints (small data centres reject many constrained jobs)",
    )
    c = r.add_argument_group("data centre")
    c.add_argument(
        "--cluster",
        default="generate",
        help="'generate', 'reference' (../shared's published 10,000-node cluster) or a cluster JSON "
        "file (default: %(default)s)",
    )
    c.add_argument("--lms", type=positive_int, default=5, help="LMs when generating (default: %(default)s)")
    c.add_argument("--gms", type=positive_int, default=5, help="GMs when generating (default: %(default)s)")
    c.add_argument(
        "--workers-per-partition",
        type=positive_int,
        default=400,
        help="workers in each LM partition when generating (default: %(default)s)",
    )
    c.add_argument("--node-cpu", type=positive_int, default=64000, help="node CPU, millicores (default: %(default)s)")
    c.add_argument("--node-mem", type=positive_int, default=16384, help="node memory, MB (default: %(default)s)")
    s = r.add_argument_group("scheduler")
    s.add_argument(
        "--scheduler",
        choices=sorted(SCHEDULERS),
        default="megha",
        help="Megha, or a baseline to compare with: centralized (one GM, one LM), pigeonc (distributors and "
        "masters of fixed groups), pigeonc-published (PigeonC with the authors' simulator's worker count, "
        "which reproduces the published figures), sparrow (batch sampling, late binding) (default: %(default)s)",
    )
    s.add_argument(
        "--matching",
        choices=sorted(CHOICE_POLICIES),
        default="random",
        help="how a GM picks among suitable nodes (default: %(default)s)",
    )
    s.add_argument(
        "--hop-delay",
        type=non_negative_float,
        default=0.0005,
        help="network delay per message hop, seconds (default: %(default)s)",
    )
    s.add_argument(
        "--delta-interval",
        type=positive_float,
        default=1.0,
        help="period of LM delta updates to each GM, seconds (default: %(default)s)",
    )
    s.add_argument("--seed", type=int, default=0, help="seed for cluster, constraints and choices (default: 0)")
    s.add_argument(
        "--realtime",
        action="store_true",
        help="run on the wall clock instead of the virtual clock: each event waits for its time, and the report's "
        "times are wall-clock times",
    )
    f = r.add_argument_group("fair scheduling (off unless --queues is given)")
    f.add_argument(
        "--queues",
        type=_queues_arg,
        default="",
        help="user queues as user:share:gm,... e.g. q1:10%%:0,q2:25%%:1,q3:15%%:1,q4:50%%:2; jobs go to the "
        "queues round-robin; a user below its share preempts users above theirs under contention",
    )
    f.add_argument(
        "--share-policy",
        choices=sorted(SHARE_POLICIES),
        default="share",
        help="share: the Megha paper's (round-robin queues); drf: Dominant Resource Fairness; demand, "
        "demand-drf: Tromino's demand-aware orderings (default: %(default)s)",
    )
    w = r.add_argument_group("failures (simulated on the virtual clock; off unless --fail is given)")
    w.add_argument(
        "--fail",
        action="append",
        default=[],
        metavar="SPEC",
        help="worker:rate=R crashes worker nodes at random, R per node per hour; worker:at=T,lm=L,node=N[,down=D] "
        "crashes one at time T; lm:rate=R, lm:at=T,lm=L[,down=D], gm:rate=R and gm:at=T,gm=G[,down=D] crash "
        "LMs and GMs (they restart D seconds later, default --fail-repair); partition:at=T,lm=L[,down=D] and "
        "partition:at=T,gm=G[,down=D] hold the messages to and from one for D seconds (repeatable)",
    )
    w.add_argument(
        "--fail-detect",
        type=positive_float,
        default=30.0,
        help="seconds until an LM notices a crashed worker (MEGHA_WORKER_TIMEOUT) (default: %(default)s)",
    )
    w.add_argument(
        "--fail-repair",
        type=positive_float,
        default=60.0,
        help="seconds after a crash until the node is back in service, or the LM or GM restarts (default: %(default)s)",
    )
    w.add_argument(
        "--max-attempts",
        type=positive_int,
        default=3,
        help="executions of a task whose worker is lost before it fails (MEGHA_MAX_ATTEMPTS) (default: 3)",
    )
    o = r.add_argument_group("output")
    o.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for tasks.csv, jobs.csv, summary.json, utilization.csv, cdf.png (default: a new folder "
        f"{REPLAY_OUT}/<date>-<time>); one that already holds a report is refused unless --overwrite",
    )
    o.add_argument("--overwrite", action="store_true", help="replace the report already in the --out folder")
    o.add_argument("--no-files", action="store_true", help="print the report only")
    o.add_argument("--quiet", action="store_true", help="nothing on stderr but errors and warnings (no progress bar)")
    for name, what, model in (
        ("gm", "a Global Master", GMSettings),
        ("lm", "a Local Master", LMSettings),
        ("worker", "a worker agent", WorkerSettings),
        ("loadgen", "the request generator against running GMs", LoadgenSettings),
    ):
        sub.add_parser(
            name,
            help=f"run {what}, configured by MEGHA_* environment variables (see docs/deploy.md)",
            description=f"Run {what}, configured by MEGHA_* environment variables (docs/deploy.md).",
            epilog=settings_help(model),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    sub.add_parser(
        "chaos",
        add_help=False,
        help="the chaos matrix: kill, stall or cut off each component mid-replay and count what was lost "
        "(megha chaos --help)",
    )
    loc = sub.add_parser(
        "local",
        help="start GMs, LMs and worker agents as local processes, replay a trace through them, report, stop",
        description="Start a whole deployment on this host (separate processes, real RabbitMQ), replay a trace "
        "through the GMs' REST API, print the report, and shut everything down (also on Ctrl-C).",
        epilog=LOCAL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    loc.add_argument("--gms", type=positive_int, default=2, help="GMs (default: %(default)s)")
    loc.add_argument("--lms", type=positive_int, default=2, help="LMs (default: %(default)s)")
    loc.add_argument("--workers-per-lm", type=positive_int, default=2, help="worker agents per LM (default: 2)")
    loc.add_argument(
        "--nodes-per-worker",
        type=positive_int,
        default=1,
        help="nodes each agent stands for; more than 1 needs --execution simulated (default: 1)",
    )
    loc.add_argument(
        "--execution",
        choices=("real", "simulated"),
        default="real",
        help="real: tasks burn their CPU and memory; simulated: no burn (default: %(default)s)",
    )
    loc.add_argument("--node-cpu", type=positive_int, default=2000, help="node CPU, millicores (default: 2000)")
    loc.add_argument("--node-mem", type=positive_int, default=4096, help="node memory, MB (default: 4096)")
    loc.add_argument(
        "--constraint-seed",
        type=int,
        default=None,
        help="draw node constraints with the published fractions (default: nodes satisfy all)",
    )
    loc.add_argument("--trace", default="demo", help="a .tr file, 'demo' or syn:<tasks>:<jobs> (default: demo)")
    loc.add_argument("--first-jobs", type=positive_int, default=20, help="jobs to replay (default: 20)")
    loc.add_argument(
        "--time-scale",
        type=positive_float,
        default=0.0002,
        help="multiply arrivals and durations; the demo's tasks last hours (default: %(default)s)",
    )
    loc.add_argument("--mode", choices=("slot", "scaled"), default="scaled", help="request mode (default: scaled)")
    loc.add_argument("--cpu-scale", type=positive_int, default=400, help="scaled mode CPU divisor (default: 400)")
    loc.add_argument(
        "--mem-scale",
        type=positive_int,
        default=1000,
        help="scaled mode memory divisor; 1000 keeps a laptop's memory safe (default: 1000)",
    )
    loc.add_argument("--seed", type=int, default=0)
    loc.add_argument(
        "--queues",
        type=_queues_arg,
        default="",
        help="fair scheduling: user queues as user:share:gm,... given to every GM, LM and the load generator",
    )
    loc.add_argument("--share-policy", choices=sorted(SHARE_POLICIES), default="share", help="(default: share)")
    loc.add_argument(
        "--delta-interval", type=positive_float, default=1.0, help="seconds between LM delta updates (default: 1)"
    )
    loc.add_argument(
        "--heartbeat-interval", type=positive_float, default=5.0, help="seconds between agent heartbeats (default: 5)"
    )
    loc.add_argument(
        "--worker-timeout",
        type=positive_float,
        default=30.0,
        help="seconds of heartbeat silence after which an LM fails a dead agent's tasks (default: 30)",
    )
    loc.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672/")
    loc.add_argument("--run-id", default=None, help="prefix of this deployment's queues (default: random)")
    loc.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"folder for the report files and service logs (default: a new folder {LOCAL_OUT}/<date>-<time>); one "
        "that already holds a report is refused unless --overwrite",
    )
    loc.add_argument("--overwrite", action="store_true", help="replace the report already in the --out folder")
    loc.add_argument("--quiet", action="store_true", help="nothing on stderr but errors and warnings (no progress bar)")
    for name, what in CTL_COMMANDS.items():
        sub.add_parser(name, add_help=False, help=what)
    return parser


def _warn(command: str, warnings: list[str]) -> None:
    for warning in warnings:
        print(f"megha {command}: WARNING: {warning}", file=sys.stderr)


def _local(args: argparse.Namespace) -> int:
    from megha.common.settings import LoadgenSettings
    from megha.deploy.local import LocalDeployment, run_local
    from megha.loadgen.progress import Progress
    from megha.loadgen.report import format_table, report_dir, run_warnings, write_outputs

    out = report_dir(args.out, LOCAL_OUT, args.overwrite)
    deployment = LocalDeployment(
        gms=args.gms,
        lms=args.lms,
        workers_per_lm=args.workers_per_lm,
        nodes_per_worker=args.nodes_per_worker,
        execution=args.execution,
        node_cpu_millicores=args.node_cpu,
        node_memory_mb=args.node_mem,
        constraint_seed=args.constraint_seed,
        queues=args.queues,
        share_policy=args.share_policy,
        delta_interval=args.delta_interval,
        heartbeat_interval=args.heartbeat_interval,
        worker_timeout=args.worker_timeout,
        amqp_url=args.amqp_url,
        log_dir=out / "logs",
        **({"run_id": args.run_id} if args.run_id else {}),
    )
    settings = LoadgenSettings(
        trace=args.trace,
        first_jobs=args.first_jobs,
        time_scale=args.time_scale,
        mode=args.mode,
        cpu_scale=args.cpu_scale,
        mem_scale=args.mem_scale,
        seed=args.seed,
        out=str(out),
    )
    try:
        run, states = run_local(deployment, settings, None if args.quiet else Progress())
    except KeyboardInterrupt:
        print("interrupted: every service was stopped", file=sys.stderr)
        return 130
    assert run.metrics is not None
    title = f"Megha local deployment ({args.gms} GMs, {args.lms} LMs, {args.workers_per_lm} agents per LM)"
    print(format_table(run.metrics, title))
    for state in states:
        print(
            f"LM {state['lm']}: {state['launched']} launched, {state['inconsistencies']} inconsistencies, "
            f"{state['repartitions']} repartitions, back to full capacity: {state['idle']}"
        )
    paths = write_outputs(
        run.metrics,
        list(run.tasks.values()),
        list(run.jobs.values()),
        out,
        title,
        {"args": {k: str(v) for k, v in vars(args).items()}},
    )
    print(f"wrote {', '.join(str(p) for p in paths.values())}; service logs in {out / 'logs'}")
    warnings = run_warnings(run.metrics)
    _warn("local", warnings)
    if run.metrics.not_exactly_once or run.timed_out or not all(s["idle"] for s in states):
        return 1
    return 3 if warnings else 0


def _replay(args: argparse.Namespace) -> int:
    from megha.loadgen.progress import Progress
    from megha.loadgen.replay import ReplayConfig, config_dict, replay
    from megha.loadgen.report import format_counters, format_table, report_dir, run_warnings, write_outputs
    from megha.loadgen.trace import demo_trace_path

    out = None if args.no_files else report_dir(args.out, REPLAY_OUT, args.overwrite)
    config = ReplayConfig(
        trace=str(demo_trace_path()) if args.trace == "demo" else args.trace,
        first_jobs=args.first_jobs,
        time_scale=args.time_scale,
        cluster=args.cluster,
        lms=args.lms,
        gms=args.gms,
        workers_per_partition=args.workers_per_partition,
        node_cpu_millicores=args.node_cpu,
        node_memory_mb=args.node_mem,
        mode=args.mode,
        matching=args.matching,
        scheduler=args.scheduler,
        hop_delay=args.hop_delay,
        delta_interval=args.delta_interval,
        seed=args.seed,
        users=args.users,
        realtime=args.realtime,
        queues=args.queues,
        constraints=not args.no_constraints,
        share_policy=args.share_policy,
        faults=parse_faults(args.fail, args.fail_detect, args.fail_repair, args.seed),
        max_attempts=args.max_attempts,
    )
    result = replay(config, None if args.quiet else Progress())
    title = f"{config.scheduler.capitalize()} replay of {args.trace} ({config.matching} matching, {config.mode} mode)"
    print(format_table(result.metrics, title))
    counters = result.system.counters()
    if counters:
        print(format_counters(config.scheduler, counters))
    if out is not None:
        extra = {
            "config": config_dict(config),
            "scheduler_counters": counters,
            "command": " ".join(["megha", *sys.argv[1:]]),
            "machine": {"python": platform.python_version(), "platform": platform.platform()},
        }
        paths = write_outputs(
            result.metrics,
            list(result.recorder.tasks.values()),
            list(result.recorder.jobs.values()),
            out,
            title,
            extra,
        )
        print(f"wrote {', '.join(str(p) for p in paths.values())}")
    warnings = run_warnings(result.metrics)
    _warn("replay", warnings)
    if result.metrics.not_exactly_once:
        return 1
    return 3 if warnings else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["chaos"]:  # its own options: `megha chaos --help`
        from megha.deploy.chaos import main as chaos_main

        return chaos_main(argv[1:])
    if argv[:1] and argv[0] in CTL_COMMANDS:
        from megha.ctl import main as ctl_main

        return ctl_main(argv)
    args = build_parser().parse_args(argv)
    try:
        if args.command == "replay":
            return _replay(args)
        if args.command == "local":
            return _local(args)
        if args.command in ("gm", "lm", "worker"):
            from megha.services import run

            getattr(run, f"serve_{args.command}")()
            return 0
        if args.command == "loadgen":
            from megha.loadgen.services import main as loadgen_main

            return loadgen_main()
    except (ValueError, FileNotFoundError) as exc:
        print(f"megha {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
