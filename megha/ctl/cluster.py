"""`megha queues` and `megha nodes`: the user queues of the GMs and the partitions of the LMs, from their typed
answers (GM `/v1/queues`, `/v1/state`; LM `/v1/state`, `/v1/cluster`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import click

from megha.client import Client, GMState, LMCluster, LMState, MeghaError
from megha.common.core.resources import DEFAULT_RESOURCE_NAMES
from megha.common.models import QueueList, QueueState
from megha.ctl.common import USAGE, Ctl, CtlError, amounts, dump, label, options, table, total, used


class _Answer(Protocol):
    def as_json(self, url: str) -> dict[str, object]: ...


A = TypeVar("A", bound=_Answer)


@dataclass
class GMQueues:
    """A GM's queues and its tasks per queue (a user's own queue only), and its state (None for a user, which may
    not read it)."""

    queues: QueueList
    state: GMState | None

    def as_json(self, url: str) -> dict[str, object]:
        state = None if self.state is None else dump(self.state)
        return {"url": url, "queues": dump(self.queues), "state": state, "tasks": dump(self.queues)["tasks"]}


def _report(
    ctl: Ctl, answers: list[tuple[str, A]], errors: list[CtlError], show: Callable[[Ctl, list[tuple[str, A]]], None]
) -> None:
    """Each service's answer as JSON (`--json`) or shown by `show`; then the first failure of those that could not
    be reached."""
    if ctl.as_json:
        ctl.emit([answer.as_json(url) for url, answer in answers])
    else:
        show(ctl, answers)
    if errors:
        raise errors[0]


def _state_if_allowed(gm: Client) -> GMState | None:
    """The GM's `/v1/state`; None when the caller may not read it (403: a user's token)."""
    try:
        return gm.state()
    except MeghaError as exc:
        if exc.status == 403:
            return None
        raise


@click.command(short_help="each user queue: share, usage, pending and running tasks")
@options()
def queues(ctl: Ctl) -> None:
    """Each user queue: share, usage, pending and running tasks (GM GET /v1/queues, /v1/state).

    Under fair scheduling, a queue's usage is that of the GM serving it (exact there); its pending and running
    tasks add up every GM's. Without it, each GM has one queue, `default`. A user sees its own queue only."""
    _report(ctl, *ctl.each(ctl.gms, lambda gm: GMQueues(gm.queues(), _state_if_allowed(gm))), _show_queues)


def _show_queues(ctl: Ctl, answers: list[tuple[str, GMQueues]]) -> None:
    tasks: dict[tuple[int | None, str], Counter[str]] = {}  # (GM or None under fair scheduling, queue) -> counts
    views: dict[str, QueueState] = {}  # queue -> the view of the GM serving it, else of the first GM
    for _, answer in answers:
        listed = answer.queues
        for queue, held in listed.tasks.items():
            at = None if listed.fair_scheduling else listed.gm
            tasks.setdefault((at, queue), Counter()).update(pending=held.pending, running=held.running)
        for q in listed.queues:
            if q.own or q.user not in views:
                views[q.user] = q
    resources = [label(name) for name in DEFAULT_RESOURCE_NAMES]
    counted = ("share", *resources, "consumption", "pending", "running")
    shown = table("user queues (CPU, memory: used now)", "queue", "GM", *counted, "below share", numeric=counted)
    for queue in views:
        tasks.setdefault((None, queue), Counter())
    for (gm, queue), held in sorted(tasks.items(), key=lambda item: (item[0][0] or 0, item[0][1])):
        q = views.get(queue)
        if gm is not None or q is None:  # no fair scheduling: each GM's one queue
            nothing = ("-" for _ in resources)
            shown.add_row(queue, str(gm), "-", *nothing, "-", str(held["pending"]), str(held["running"]), "-")
            continue
        shown.add_row(
            queue,
            str(q.gm),
            f"{100 * q.share:g}%",
            *(f"{amount:,}" for amount in q.usage),
            f"{q.consumption:g}",
            str(held["pending"]),
            str(held["running"]),
            "yes" if q.below_share else "no",
        )
    ctl.print(shown)
    for url, answer in answers:
        s = answer.state
        if s is None:
            continue  # a user's token: the GM's state is the operators'
        policy = answer.queues.policy or "off"
        now = f"{s.queued} queued, {s.waiting} waiting, {s.running} running"
        ctl.print(f"GM {s.gm} ({url}): fair scheduling {policy}; tasks {now}")


@dataclass
class LMNodes:
    """An LM's state and its partitions (None while it is not ready)."""

    state: LMState
    cluster: LMCluster | None

    def as_json(self, url: str) -> dict[str, object]:
        return {"url": url, "state": dump(self.state), "cluster": None if self.cluster is None else dump(self.cluster)}

    def partitions(self) -> list[tuple[int, range]]:
        """(GM, its nodes' numbers) for each partition: the LM numbers its nodes across partitions in GM order."""
        assert self.cluster is not None
        found, start = [], 0
        for part in self.cluster.partitions:
            found.append((part.gm, range(start, start + len(part.capacities))))
            start += len(part.capacities)
        return found


def _lm_nodes(lm: Client) -> LMNodes:
    state = lm.get("/v1/state", LMState)
    try:
        cluster: LMCluster | None = lm.get("/v1/cluster", LMCluster)
    except MeghaError as exc:
        if exc.status is None:
            raise
        cluster = None  # not ready (503)
    return LMNodes(state, cluster)


def lms_from_gm(ctl: Ctl) -> None:
    """Without --lm or $MEGHA_LM_URLS, the LM URLs the first GM that answers uses (GM GET /v1/state)."""
    if ctl.lms:
        return
    for gm in ctl.gms:
        try:
            ctl.lms = ctl.client.at(gm).state().lm_urls
        except MeghaError:
            continue
        return


@click.command(short_help="each LM partition: nodes in and out of service, free resources")
@options(lms=True)
def nodes(ctl: Ctl) -> None:
    """Each LM's partitions: nodes in and out of service, free of capacity, used (LM GET /v1/state, /v1/cluster).

    The LMs come from --lm or $MEGHA_LM_URLS, else from the first GM (the URLs it reaches them at, which may not be
    reachable from here: in containers, give --lm)."""
    lms_from_gm(ctl)
    if not ctl.lms:
        raise CtlError("give the LMs' URLs with --lm URL (or MEGHA_LM_URLS=URL,URL)", USAGE)
    _report(ctl, *ctl.each(ctl.lms, _lm_nodes), _show_nodes)


def _show_nodes(ctl: Ctl, answers: list[tuple[str, LMNodes]]) -> None:
    names = next((a.cluster.resource_names for _, a in answers if a.cluster), list(DEFAULT_RESOURCE_NAMES))
    counted = ("LM", "partition", "nodes", "in service", "out", "used")
    headings = ("LM", "partition", "nodes", "in service", "out", *(label(n) for n in names), "used")
    shown = table("nodes per LM partition (resources: free/capacity)", *headings, numeric=counted)
    for _, answer in answers:
        state = answer.state
        if answer.cluster is None:
            registered = f"{state.registered_nodes}/{state.expected_nodes} registered"
            shown.add_row(str(state.lm), "-", registered, "-", "-", *("-" for _ in names), "not ready")
            continue
        down = {int(n) for n in state.down_nodes}
        for gm, numbers in answer.partitions():
            free = total((state.free[n] for n in numbers), len(names))
            capacity = total((state.capacity[n] for n in numbers), len(names))
            out = len(down.intersection(numbers))
            in_service = str(len(numbers) - out)
            shown.add_row(
                str(state.lm),
                f"GM {gm}",
                str(len(numbers)),
                in_service,
                str(out),
                *amounts(free, capacity),
                used(free, capacity),
            )
    ctl.print(shown)
    for url, answer in answers:
        state = answer.state
        held = f"tasks running {state.running}, logical nodes {state.logical_nodes}"
        ctl.print(f"LM {state.lm} ({url}): worker agents {state.workers}, {held}")
        for node, why in state.down_nodes.items():
            ctl.print(f"  node {node} out of service: {why}")
