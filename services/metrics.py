"""What every service's GET /metrics shares: one registry per app, whose collector reads the service's own counters
and state when Prometheus scrapes, so the scheduling core's paths stay untouched.

Every sample carries the identity of the service it describes as a label: `gm="0"`, `lm="1"` or
`worker="worker-0-0"` (a GM standing in for another also reports the identity it holds, under that identity's
`gm`). Each service's collector lives beside it (`gm/metrics.py`, `lm/metrics.py`, `worker/metrics.py`);
docs/metrics.md lists every metric, its labels and where it comes from.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Protocol

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from megha.common.transport.rabbit import Broker

FAIR_SHARE = "fair_share"
"""The `reason` of a preemption made for a user below its share (Algorithm 2), today the only reason."""


class Family:
    """A metric family whose every sample carries the service's identity label first."""

    def __init__(self, family: Metric, identity: str) -> None:
        self.family = family
        self.identity = identity

    def add(self, value: float, *labels: str) -> None:
        self.family.add_metric([self.identity, *labels], value)


class Identity:
    """Builds the families of one service identity (`key`="gm", "lm" or "worker"; `value` its id)."""

    def __init__(self, key: str, value: object) -> None:
        self.key = key
        self.value = str(value)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Family:
        return Family(GaugeMetricFamily(name, doc, labels=[self.key, *labels]), self.value)

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Family:
        return Family(CounterMetricFamily(name, doc, labels=[self.key, *labels]), self.value)

    def single(self, name: str, doc: str, value: float) -> Metric:
        """An unlabelled gauge of one value."""
        family = self.gauge(name, doc)
        family.add(value)
        return family.family

    def counters(self, specs: Iterable[tuple[str, str, float]]) -> Iterator[Metric]:
        """One unlabelled counter per (name, doc, value)."""
        for name, doc, value in specs:
            family = self.counter(name, doc)
            family.add(value)
            yield family.family


class Service(Protocol):
    """What every service's metrics read of it: its broker connection (None: none, in tests), at each scrape."""

    @property
    def broker(self) -> Broker | None: ...


class ServiceCollector(Collector):
    """One service's collector: what every service reports (which Megha it runs, its broker connection's counters),
    then its own families (`families(me)`), all labelled with its identity `me`."""

    def __init__(self, me: Identity, service: Service, families: Callable[[Identity], Iterable[Metric]]) -> None:
        self.me = me
        self.service = service
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield _build_info(self.me)
        if (broker := self.service.broker) is not None:
            yield from _broker_counters(self.me, broker)
        yield from self.families(self.me)


def _build_info(identity: Identity) -> Metric:
    try:
        megha = version("megha")
    except PackageNotFoundError:
        megha = "unknown"
    info = identity.gauge(
        "megha_build_info", "Always 1; the labels say which Megha and Python run.", ["version", "python"]
    )
    info.add(1, megha, platform.python_version())
    return info.family


def _broker_counters(identity: Identity, broker: Broker) -> Iterator[Metric]:
    yield from identity.counters(
        (
            ("megha_broker_published_total", "Messages published and confirmed by RabbitMQ.", broker.published),
            (
                "megha_broker_publish_failures_total",
                "Publishes RabbitMQ did not confirm (they are sent again from the outbox).",
                broker.publish_failures,
            ),
            (
                "megha_broker_requeued_total",
                "Delivered messages whose handler failed and were requeued.",
                broker.requeued,
            ),
            (
                "megha_broker_dead_lettered_total",
                "Delivered messages given up after the delivery limit and dead-lettered.",
                broker.dead_lettered,
            ),
        )
    )


def registry_of(me: Identity, service: Service, families: Callable[[Identity], Iterable[Metric]]) -> CollectorRegistry:
    """A registry of its own for one service (`ServiceCollector`)."""
    registry = CollectorRegistry()
    registry.register(ServiceCollector(me, service, families))
    return registry


def mount_metrics(app: FastAPI, registry: CollectorRegistry) -> None:
    """GET /metrics: `registry` in Prometheus's text exposition format, unauthenticated like /healthz, and left
    out of the OpenAPI schema (it is not JSON)."""

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_PLAIN_0_0_4)
