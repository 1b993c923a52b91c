"""Integration with the real RabbitMQ: deltas and completions published by the LM service and consumed through
the broker, as the GM service consumes them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from megha.common.core.messages import FinishedTask, LaunchBatch, Placement, WorkerReport
from megha.common.core.task import TaskSpec
from megha.common.models import BrokerMessage, TaskEvents, WorkerNode, WorkerRegistration, WorkerReportModel
from megha.common.settings import LMSettings, WorkerSettings
from megha.common.transport.rabbit import AMQP_HEARTBEAT, Broker, TryLater, gm_key, lm_key, with_heartbeat
from megha.deploy.broker_node import broker_node
from megha.services.lm.service import LMService
from megha.services.logs import configure_logging
from megha.services.worker.agent import WorkerAgent

from servicekit import AMQP, needs_rabbitmq, wait_for

pytestmark = [
    needs_rabbitmq,
    pytest.mark.asyncio,
]


class Inbox:
    """Collects the broker messages of one queue."""

    def __init__(self) -> None:
        self.messages: list[BrokerMessage] = []
        self.arrived = asyncio.Event()

    async def __call__(self, body: bytes) -> None:
        self.messages.append(BrokerMessage.model_validate_json(body))
        self.arrived.set()

    async def next(self, timeout: float = 5.0) -> BrokerMessage:
        while not self.messages:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), timeout)
        return self.messages.pop(0)


@contextlib.asynccontextmanager
async def fresh_broker(**options: Any) -> AsyncIterator[Broker]:
    """A connection of a fresh run (`options`: more of Broker's), closed at the end."""
    broker = Broker(AMQP, f"test-{uuid.uuid4().hex[:8]}", **options)
    await broker.connect()
    try:
        yield broker
    finally:
        await broker.close()


async def test_lm_deltas_and_completions_travel_through_the_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    async with fresh_broker() as broker:
        run_id = broker.run_id
        inboxes = [Inbox(), Inbox()]
        queues = [await broker.consume("gm", gm_key(g), inboxes[g]) for g in (0, 1)]
        settings = LMSettings(lm_id=0, num_gms=2, expected_nodes=2, delta_interval=0.05, run_id=run_id, amqp_url=AMQP)
        lm = LMService(settings, broker)
        queues.append(await broker.consume("lm", lm_key(0), lm.on_broker_message))
        launched: list[object] = []

        def fake_workers(launch: object) -> None:
            launched.append(launch)

        monkeypatch.setattr(lm.dispatch, "send_to_workers", fake_workers)
        try:
            node = WorkerNode(capacity={"cpu_millicores": 1000, "memory_mb": 1024}, constraints=[3])
            await lm.register(WorkerRegistration(worker_id="w", url="http://127.0.0.1:9", nodes=[node, node]))
            # A new LM incarnation tells every GM every node's state (a GM may hold a crashed incarnation's).
            for inbox in inboxes:
                first = (await inbox.next()).delta
                assert first is not None and sorted((n.node, n.free) for n in first.nodes) == [
                    (0, [1000, 1024]),
                    (1, [1000, 1024]),
                ]
            task = TaskSpec("j.0", "j", "u", 1.0, (400, 100), 1 << 3)
            response = await lm.launch(LaunchBatch(0, 0, 1, [Placement(task, 0, 0, False)]))
            assert [p.task.task_id for p in response.accepted] == ["j.0"]
            # GM 1 learns of GM 0's placement from the periodic delta, through its queue.
            delta = (await inboxes[1].next()).delta
            assert delta is not None and delta.gm == 1
            assert [(n.node, n.free) for n in delta.nodes] == [(0, [600, 924])]
            # The worker reports completion through the LM's queue; GM 0 gets the completion through its queue...
            report = WorkerReportModel.from_core(WorkerReport(0, [FinishedTask("j.0", 0)]))
            await broker.publish("lm", lm_key(0), BrokerMessage(worker_report=report).model_dump_json().encode())
            completions = (await inboxes[0].next()).completions
            assert completions is not None and [c.task_id for c in completions.items] == ["j.0"]
            assert completions.items[0].state.free == [1000, 1024]
            # ...and GM 1 sees the freed node in its next delta, while GM 0's own completion never appears as a delta.
            delta = (await inboxes[1].next()).delta
            assert delta is not None and [(n.node, n.free) for n in delta.nodes] == [(0, [1000, 1024])]
            await asyncio.sleep(0.2)  # an absence: no delta of its own comes to GM 0 meanwhile
            assert all(m.delta is None for m in inboxes[0].messages)
            assert lm.core is not None and lm.core.is_idle() and len(launched) == 1
        finally:
            await lm.close()
            for q in queues:
                await broker.delete_queue(q)


async def _dead_letters(broker: Broker, want: int, timeout: float = 20.0) -> list[bytes]:
    """Wait until `<run>.dead-letters` holds `want` messages and return their bodies."""
    got: list[bytes] = []
    done = asyncio.Event()

    async def collect(body: bytes) -> None:
        got.append(body)
        if len(got) >= want:
            done.set()

    await broker.consume("dead", "", collect, queue=f"{broker.run_id}.dead-letters")
    await asyncio.wait_for(done.wait(), timeout)
    return got


@contextlib.asynccontextmanager
async def retrying_broker(key: str, **options: Any) -> AsyncIterator[Broker]:
    """A connection of a fresh run that requeues a failed message after 0.05 s (`options`: more of Broker's); the
    run's queue `key` and its dead letters are deleted at the end."""
    async with fresh_broker(retry_pause=0.05, **options) as broker:
        try:
            yield broker
        finally:
            await broker.delete_run([key])


async def test_a_message_whose_handler_keeps_failing_is_retried_then_dead_lettered_never_dropped() -> None:
    calls: list[bytes] = []

    async def failing(body: bytes) -> None:
        calls.append(body)
        raise RuntimeError("cannot apply")

    async with retrying_broker(lm_key(7), delivery_limit=3) as broker:
        await broker.consume("lm", lm_key(7), failing)
        await broker.publish("lm", lm_key(7), b'{"x": 1}')
        assert await _dead_letters(broker, 1) == [b'{"x": 1}']
        # Delivered, then requeued until the queue's delivery limit: retried, never lost.
        assert calls == [b'{"x": 1}'] * 3  # requeued twice, dead-lettered on the third failure
        assert broker.requeued == 2 and broker.dead_lettered == 1


async def test_a_handler_that_says_try_later_gets_the_message_again() -> None:
    calls: list[bytes] = []
    applied = asyncio.Event()

    async def not_ready_at_first(body: bytes) -> None:
        calls.append(body)
        if len(calls) < 3:
            raise TryLater("cluster not complete")
        applied.set()

    async with retrying_broker(lm_key(3)) as broker:
        await broker.consume("lm", lm_key(3), not_ready_at_first)
        await broker.publish("lm", lm_key(3), b"report")
        await asyncio.wait_for(applied.wait(), 10)
        assert calls == [b"report"] * 3


async def test_the_backlog_counts_the_messages_waiting_and_those_handled_here_until_each_is_settled() -> None:
    """`Broker.backlog`, which an LM that starts waits to be 0 before it answers GMs' claims: the messages waiting
    in a queue and those its consumer here is handling or giving back (TryLater), until each is acked."""
    calls: list[bytes] = []
    release = asyncio.Event()

    async def slow(body: bytes) -> None:
        calls.append(body)
        if len(calls) == 1:
            raise TryLater("cluster not complete")  # given back after the pause: still in the backlog meanwhile
        await release.wait()

    async with retrying_broker(lm_key(4)) as broker:
        for i in range(3):
            await broker.publish_confirmed("lm", lm_key(4), b"report %d" % i)
        assert await broker.backlog("lm", lm_key(4)) == 3  # no consumer yet: all three wait
        await broker.consume("lm", lm_key(4), slow)
        await wait_for(lambda: len(calls) >= 4, 10, lambda: calls)  # the first given back and handled again
        assert await broker.backlog("lm", lm_key(4)) == 3  # every one taken, none settled
        release.set()
        assert await wait_for(lambda: _settled(broker, lm_key(4)), 10, lambda: broker.backlog("lm", lm_key(4)))
        assert sorted(calls) == [b"report 0", b"report 0", b"report 1", b"report 2"]


async def _settled(broker: Broker, key: str) -> bool:
    return await broker.backlog("lm", key) == 0


async def test_a_malformed_message_is_dead_lettered_at_once() -> None:
    calls: list[bytes] = []

    async def parse(body: bytes) -> None:
        calls.append(body)
        BrokerMessage.model_validate_json(body)

    async with retrying_broker(lm_key(5)) as broker:
        await broker.consume("lm", lm_key(5), parse)
        await broker.publish("lm", lm_key(5), b"{}")
        assert await _dead_letters(broker, 1) == [b"{}"]
        assert calls == [b"{}"] and broker.dead_lettered == 1


async def test_publish_confirmed_returns_once_the_broker_confirmed_the_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`publish` returns once the message is in the outbox; `publish_confirmed` only once RabbitMQ confirmed it
    (here held back at the sender until the test lets it go)."""
    async with fresh_broker() as broker:
        got: list[bytes] = []

        async def collect(body: bytes) -> None:
            got.append(body)

        await broker.consume("gm", gm_key(0), collect)
        gate = asyncio.Event()
        send = broker._publish_one

        async def held(*message: Any) -> None:
            await gate.wait()
            await send(*message)

        monkeypatch.setattr(broker, "_publish_one", held)
        confirmed = asyncio.ensure_future(broker.publish_confirmed("gm", gm_key(0), b"1"))
        await broker.publish("gm", gm_key(0), b"2")  # returns at once: in the outbox
        await asyncio.sleep(0.1)
        assert not confirmed.done() and broker.pending == 2
        gate.set()
        await asyncio.wait_for(confirmed, 10)
        await wait_for(lambda: sorted(got) == [b"1", b"2"], 10, lambda: got)


async def test_publishes_during_a_broker_outage_are_held_and_delivered_once_it_is_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A private RabbitMQ node is killed (SIGKILL) while a publisher keeps publishing, and started again 5 s later
    on the same data: every message published before, during and after the outage is delivered, and the
    consumer's connection comes back by itself. Each connection says once that it was lost (not on each of the
    attempts to reconnect, one a second), and how long it was away when it is back."""
    caplog.set_level(logging.INFO, logger="megha.common.transport.rabbit")
    with broker_node() as node:
        publisher = Broker(node.url, "outage")
        consumer = Broker(node.url, "outage")
        await publisher.connect()
        await consumer.connect()
        got: list[int] = []

        async def collect(body: bytes) -> None:
            got.append(int(body))

        await consumer.consume("gm", gm_key(0), collect)
        try:
            for i in range(50):
                await publisher.publish("gm", gm_key(0), str(i).encode())
            assert await publisher.flush(10)
            await asyncio.to_thread(node.kill)
            for i in range(50, 100):  # the broker is away: these wait in the outbox
                await publisher.publish("gm", gm_key(0), str(i).encode())
            await asyncio.sleep(5)  # the outage (the fault, not a wait)
            assert publisher.pending >= 50 - 10  # not confirmed while it is down (a window may be in flight)
            await asyncio.to_thread(node.start)
            assert await publisher.flush(60), f"{publisher.pending} messages never confirmed"
            for i in range(100, 150):
                await publisher.publish("gm", gm_key(0), str(i).encode())
            assert await publisher.flush(10)
            await wait_for(lambda: set(got) == set(range(150)), 60, lambda: sorted(set(range(150)) - set(got)))
            assert publisher.publish_failures > 0
            lines = [r.getMessage() for r in caplog.records if r.name == "megha.common.transport.rabbit"]
            assert sum("lost; reconnecting" in line for line in lines) == 2, lines  # the publisher and the consumer
            back = [line for line in lines if line.startswith("reconnected to RabbitMQ")]
            assert len(back) == 2 and all(re.search(r" after \d+\.\d s;", line) for line in back), back
        finally:
            await publisher.close(flush_timeout=1)
            await consumer.close(flush_timeout=1)


async def test_a_broker_short_of_disk_is_logged_as_blocking_publishes_and_the_end_of_it_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A resource alarm on a private RabbitMQ node (its free-disk limit raised above what the disk has): the
    services' log says that the broker blocks the connection's publishes and why, and when it unblocks them, in a
    line of their own (aiormq's other lines stay out); what was published meanwhile is delivered after."""
    configure_logging("INFO", "test")  # the services' logging set-up: its filter of aiormq's lines
    caplog.set_level(logging.INFO)
    with broker_node() as node:
        publisher = Broker(node.url, "alarm")
        await publisher.connect()
        try:
            await asyncio.to_thread(node.ctl, "set_disk_free_limit", "1000000GB", timeout=30)
            await publisher.publish("gm", gm_key(0), b"1")  # the broker blocks the connection when it publishes

            def lines() -> list[str]:
                return [r.getMessage() for r in caplog.records if r.name.startswith("aiormq")]

            await wait_for(lambda: any("blocked this connection's publishes" in x for x in lines()), 30, lines)
            assert "low on disk" in lines()[0] and "resource alarm" in lines()[0]
            assert not await publisher.flush(1)  # nothing is taken while it lasts
            await asyncio.to_thread(node.ctl, "set_disk_free_limit", "1MB", timeout=30)
            await wait_for(lambda: "RabbitMQ unblocked this connection's publishes" in lines(), 30, lines)
            assert await publisher.flush(20)
            assert len(lines()) == 2, lines()
        finally:
            await publisher.close(flush_timeout=1)


class BlackHole:
    """A TCP relay to RabbitMQ that can go silent without closing anything, as a network cut does: bytes are
    dropped both ways while the sockets stay open, and new connections are accepted but hear nothing."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.cut = False
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> BlackHole:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        born_cut = self.cut
        try:
            broker_r, broker_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await src.read(65536):
                    if not self.cut and not born_cut:
                        dst.write(data)
                        await dst.drain()
            dst.close()

        await asyncio.gather(pipe(client_r, broker_w), pipe(broker_r, client_w))


async def test_the_services_ask_for_a_short_amqp_heartbeat_unless_the_url_names_one() -> None:
    assert with_heartbeat("amqp://u:p@h:5672/") == f"amqp://u:p@h:5672/?heartbeat={AMQP_HEARTBEAT}"
    assert with_heartbeat("amqp://h/vh?x=1") == f"amqp://h/vh?x=1&heartbeat={AMQP_HEARTBEAT}"
    assert with_heartbeat("amqp://h/?heartbeat=30") == "amqp://h/?heartbeat=30"


async def test_a_connection_cut_without_a_close_is_dropped_and_made_again_once_the_broker_answers() -> None:
    """The network between a service and RabbitMQ goes silent (no FIN, no RST) for 30 s: the service notices by
    the AMQP heartbeat within about 20 s, not RabbitMQ's default 60 s plus TCP's retransmission backoff, and once
    the network carries again its connection is back within seconds and what it published meanwhile arrives."""
    host = AMQP.rsplit("@", 1)[1].split("/", 1)[0]
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    async with BlackHole(host) as hole:
        cut_off = Broker(AMQP.replace(host, f"127.0.0.1:{hole.port}"), run_id)
        reader = Broker(AMQP, run_id)
        await cut_off.connect()
        await reader.connect()
        got: list[int] = []

        async def collect(body: bytes) -> None:
            got.append(int(body))

        queue = await reader.consume("gm", gm_key(0), collect)
        lost = asyncio.Event()
        assert cut_off._connection is not None
        cut_off._connection.close_callbacks.add(lambda *_: lost.set())
        try:
            hole.cut = True
            cut_at = time.monotonic()
            await cut_off.publish("gm", gm_key(0), b"1")
            await asyncio.wait_for(lost.wait(), 30)
            noticed = time.monotonic() - cut_at
            assert noticed < 4 * (AMQP_HEARTBEAT + 1), noticed
            await asyncio.sleep(max(0.0, 30 - noticed))
            hole.cut = False
            await cut_off.publish("gm", gm_key(0), b"2")
            assert await cut_off.flush(20), f"{cut_off.pending} messages not confirmed 20 s after the cut ended"
            await wait_for(lambda: {1, 2} <= set(got), 10, lambda: got)
        finally:
            await cut_off.close(flush_timeout=1)
            await reader.delete_queue(queue)
            await reader.close()


async def test_worker_heartbeats_reach_the_lm_through_the_broker() -> None:
    async with fresh_broker() as broker:
        run_id = broker.run_id
        lm = LMService(LMSettings(lm_id=0, num_gms=1, expected_nodes=1, run_id=run_id, amqp_url=AMQP), broker)
        queue = await broker.consume("lm", lm_key(0), lm.on_broker_message)
        settings = WorkerSettings(worker_id="w-hb", execution="simulated", run_id=run_id, amqp_url=AMQP)
        agent = WorkerAgent(settings, broker)
        try:
            agent.registered = await lm.register(
                WorkerRegistration(worker_id="w-hb", url="http://127.0.0.1:9", nodes=agent.nodes())
            )
            await agent.heartbeat()
            await wait_for(lambda: "w-hb" in lm.state()["heartbeats"], 5, lm.state)  # type: ignore[operator]
            beat = lm.state()["heartbeats"]["w-hb"]  # type: ignore[index]
            assert beat["running"] == 0 and 0 <= beat["age_seconds"] < 5
        finally:
            await agent.close()
            await lm.close()
            await broker.delete_queue(queue)


async def test_tasks_an_unreachable_agent_never_got_are_freed_and_reported_lost_for_a_retry() -> None:
    async with fresh_broker() as broker:
        run_id = broker.run_id
        gm_inbox, events = Inbox(), []
        event_arrived = asyncio.Event()

        async def on_events(body: bytes) -> None:
            events.extend(TaskEvents.model_validate_json(body).events)
            event_arrived.set()

        queues = [
            await broker.consume("gm", gm_key(0), gm_inbox),
            await broker.consume("events", "", on_events, queue=f"{run_id}.events.test"),
        ]
        lm = LMService(
            LMSettings(lm_id=0, num_gms=1, expected_nodes=1, http_timeout=0.5, run_id=run_id, amqp_url=AMQP), broker
        )
        try:
            node = WorkerNode(capacity={"cpu_millicores": 1000, "memory_mb": 1024})
            await lm.register(
                WorkerRegistration(worker_id="gone", url="http://127.0.0.1:9", nodes=[node])
            )  # nobody listens
            task = TaskSpec("j.0", "j", "u", 1.0, (1000, 1024), 0)
            response = await lm.launch(LaunchBatch(0, 0, 1, [Placement(task, 0, 0, False)]))
            assert len(response.accepted) == 1
            await asyncio.wait_for(event_arrived.wait(), 10)
            assert [(e.kind, e.task_id, e.attempt) for e in events] == [("lost", "j.0", 1)]
            assert "unreachable" in events[0].error
            # The agent does not answer its health check either: its node is out of service until it is heard
            # again, so the GM places nothing more there meanwhile (it showed the node free: the GM placed the task
            # there again at once, and spent its attempts on it).
            completions = (await gm_inbox.next()).completions
            assert completions is not None and completions.items[0].state.free == [0, 0]
            # The GM places the task again as its next attempt (or fails it after MEGHA_MAX_ATTEMPTS), with the reason.
            assert completions.items[0].lost and "unreachable" in completions.items[0].error
            assert lm.core is not None and not lm.core.running and lm.state()["failed_launches"] == 1
            assert list(lm.core.down) == [0] and lm.core.free == [(0, 0)]  # out of service: it shows nothing free
        finally:
            await lm.close()
            for q in queues:
                await broker.delete_queue(q)


async def test_a_handler_cut_off_by_its_channel_closing_runs_to_its_end() -> None:
    """aiormq cancels the consumer callbacks of a channel that closes (the broker went away). A handler that had
    changed state and not yet published what follows from it would lose that for good, since the message that
    comes again finds the change made; so a started handler runs to its end, and the message comes again."""
    async with fresh_broker() as broker:
        started, release = asyncio.Event(), asyncio.Event()
        runs: list[str] = []

        async def handler(body: bytes) -> None:
            runs.append("started")
            started.set()
            try:
                await release.wait()  # the channel closes while the first run is here
            except asyncio.CancelledError:
                runs.append("cancelled")
                raise
            runs.append("ended")

        try:
            await broker.consume("gm", gm_key(0), handler)
            # Confirmed before the channel closes: a publish whose confirm the close cuts off is sent again (the
            # publisher cannot know the broker had it), which would deliver the message a third time here.
            await broker.publish_confirmed("gm", gm_key(0), b"1")
            await asyncio.wait_for(started.wait(), 10)
            assert broker._channel is not None
            channel = await broker._channel.get_underlay_channel()
            await channel.close()  # as when the connection drops: aiormq cancels the channel's consumer tasks
            # The message was not acked on the closed channel: it comes again once the channel is restored.
            await wait_for(lambda: runs.count("started") == 2, 30, lambda: runs)
            release.set()
            await wait_for(lambda: runs.count("ended") == 2, 10, lambda: runs)
            assert "cancelled" not in runs, runs
        finally:
            await broker.delete_run([gm_key(0)])
