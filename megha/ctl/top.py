"""`megha top`: a live view of every GM's tasks and jobs by state and every LM's free resources, refreshed from
their typed answers (GM `/v1/state`, `/v1/jobs?state=S&limit=1`; LM `/v1/state`)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

import click
from rich.console import Group
from rich.live import Live
from rich.text import Text

from megha.client import Client, GMState, LMState, MeghaError
from megha.common.core.resources import DEFAULT_RESOURCE_NAMES
from megha.ctl.cluster import lms_from_gm
from megha.ctl.common import Ctl, CtlError, amounts, dump, label, options, table, total, used
from megha.ctl.jobs import JOB_STATES
from megha.options import Bounded

A = TypeVar("A")


@dataclass
class GMTop:
    """A GM's state and its number of jobs in each state."""

    state: GMState
    jobs: dict[str, int]


@dataclass
class Frame:
    """One refresh of `megha top`: each service's answer, or why it gave none."""

    gms: list[tuple[str, GMTop | CtlError]]
    lms: list[tuple[str, LMState | CtlError]]

    @property
    def errors(self) -> list[CtlError]:
        return [a for _, a in (*self.gms, *self.lms) if isinstance(a, CtlError)]

    def as_json(self) -> dict[str, list[dict[str, Any]]]:
        def one(url: str, answer: GMTop | LMState | CtlError) -> dict[str, Any]:
            if isinstance(answer, CtlError):
                return {"url": url, "error": answer.message}
            if isinstance(answer, GMTop):
                return {"url": url, "state": dump(answer.state), "jobs": answer.jobs}
            return {"url": url, **dump(answer)}

        return {"gms": [one(*a) for a in self.gms], "lms": [one(*a) for a in self.lms]}


def _gm_top(gm: Client) -> GMTop:
    return GMTop(gm.state(), {s: gm.list(state=s, limit=1).total for s in JOB_STATES})  # type: ignore[arg-type]


def _guarded(ctl: Ctl, ask: Callable[[Client], A]) -> Callable[[str], tuple[str, A | CtlError]]:
    def run(url: str) -> tuple[str, A | CtlError]:
        try:
            return url, ask(ctl.client.at(url))
        except MeghaError as exc:
            return url, ctl.failure(exc)

    return run


def _fetch(ctl: Ctl, pool: ThreadPoolExecutor) -> Frame:
    gms = pool.map(_guarded(ctl, _gm_top), ctl.gms)
    lms = pool.map(_guarded(ctl, lambda lm: lm.get("/v1/state", LMState)), ctl.lms)
    return Frame(list(gms), list(lms))


def _render(frame: Frame, interval: float) -> Group:
    tasks = ("queued", "waiting", "running", "unfinished")
    gms = table("GMs (tasks)", "GM", *tasks, numeric=tasks)
    jobs = table("jobs by state", "GM", *JOB_STATES, numeric=JOB_STATES)
    totals: Counter[str] = Counter()
    for _, answer in frame.gms:
        if isinstance(answer, CtlError):
            continue
        s = answer.state
        gms.add_row(str(s.gm), str(s.queued), str(s.waiting), str(s.running), str(s.unfinished_tasks))
        jobs.add_row(str(s.gm), *(str(answer.jobs[state]) for state in JOB_STATES))
        totals.update(answer.jobs)
    if len(frame.gms) > 1:
        jobs.add_row("all", *(str(totals[state]) for state in JOB_STATES), style="bold")
    resources = [label(name) for name in DEFAULT_RESOURCE_NAMES]
    counted = ("nodes", "out of service", "running", *resources, "used")
    lms = table("LMs (resources: free/capacity)", "LM", *counted, numeric=counted)
    for _, lm in frame.lms:
        if isinstance(lm, CtlError):
            continue
        free, capacity = total(lm.free, len(resources)), total(lm.capacity, len(resources))
        nodes = (str(lm.registered_nodes), str(len(lm.down_nodes)), str(lm.running))
        lms.add_row(str(lm.lm), *nodes, *amounts(free, capacity), used(free, capacity))
    parts: list[Any] = [
        Text(f"megha top  {time.strftime('%H:%M:%S')}  every {interval:g} s  (Ctrl-C quits)", style="bold"),
        gms,
        jobs,
    ]
    parts.append(lms if frame.lms else Text("LMs: give --lm URL or MEGHA_LM_URLS to see their nodes", style="dim"))
    parts += [Text(error.message, style="red") for error in frame.errors]
    return Group(*parts)


@click.command(short_help="a live view of GMs, LMs and jobs")
@click.option(
    "--interval",
    type=Bounded(float, ge=0.1, le=86400),
    default=1.0,
    show_default=True,
    help="seconds between refreshes (0.1 to 86400)",
)
@click.option("--iterations", type=click.IntRange(min=0), default=0, help="refreshes before exiting (0: until Ctrl-C)")
@options(lms=True)
def top(ctl: Ctl, interval: float, iterations: int) -> None:
    """A live view: each GM's queued, waiting and running tasks and its jobs by state; each LM's free and used
    resources. Ctrl-C quits (exit status 0). With --json, one JSON object per refresh."""
    lms_from_gm(ctl)
    pool = ThreadPoolExecutor(max_workers=max(4, len(ctl.gms) + len(ctl.lms)))
    live = Live(console=ctl.console, auto_refresh=False) if ctl.console.is_terminal and not ctl.as_json else None
    frame = None
    try:
        with live or nullcontext():
            done = 0
            while True:
                frame = _fetch(ctl, pool)
                if ctl.as_json:
                    click.echo(json.dumps(frame.as_json()))
                elif live is not None:
                    live.update(_render(frame, interval), refresh=True)
                else:  # not a terminal: one frame after another
                    ctl.print(_render(frame, interval))
                done += 1
                if done == iterations:
                    break
                time.sleep(interval)
    except KeyboardInterrupt:
        return
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    if frame is not None and frame.errors:
        raise frame.errors[0]
