"""A RabbitMQ user per role with least-privilege permissions (common/transport/rabbit.py `broker_permissions`), made
by deploy/secrets.py and imported into the real broker: a deployment whose every role connects as its own user
replays a trace to the end, and each user is refused (ACCESS_REFUSED) what its role must not do."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aio_pika
import aiormq
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from brokerkit import rabbitmqctl

from megha.common.settings import LoadgenSettings
from megha.common.transport.rabbit import BROKER_ROLES, Broker, broker_user, gm_key, lm_key
from megha.deploy.secrets import ADMIN, DEFINITIONS, make_secrets, url_file
from megha.loadgen.services import replay_services

from servicekit import AMQP, needs_rabbitmq, small_deployment, wait_until

pytestmark = needs_rabbitmq

Action = Callable[[AbstractChannel], Awaitable[object]]


async def _connects(url: str) -> bool:
    try:
        connection = await aio_pika.connect(url, timeout=5)
    except Exception:
        return False
    await connection.close()
    return True


@pytest.fixture
def users(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A fresh run id and each role's broker URL, its user imported into the broker (and deleted at the end)."""
    run_id = f"users-{uuid.uuid4().hex[:8]}"
    made = make_secrets(tmp_path / "secrets", run_id, "amqp://127.0.0.1:5672/")
    urls = {role: made[url_file(role)].read_text().strip() for role in BROKER_ROLES}
    with made[DEFINITIONS].open() as definitions:  # the CLI reads stdin as root; a file it opens as rabbitmq
        imported = rabbitmqctl("import_definitions", stdin=definitions, capture_output=True)
    assert imported.returncode == 0, imported.stderr
    try:
        # The import is asynchronous: wait until every user can log in.
        wait_until(lambda: all(asyncio.run(_connects(u)) for u in urls.values()), 30, lambda: urls.keys(), 0.2)
        yield run_id, urls
    finally:
        for role in (*BROKER_ROLES, ADMIN):
            rabbitmqctl("delete_user", broker_user(run_id, role), capture_output=True)
        asyncio.run(_delete_run(run_id))


async def _delete_run(run_id: str) -> None:
    admin = Broker(AMQP, run_id, connect_timeout=5.0)
    await admin.connect()
    try:
        await admin.delete_run([gm_key(0), lm_key(0)])
    finally:
        await admin.close(flush_timeout=0.5)


def test_a_deployment_of_role_users_replays_every_task(users: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    run_id, urls = users
    deployment = small_deployment(
        tmp_path / "logs", workers_per_lm=2, nodes_per_worker=2, run_id=run_id, amqp_urls=urls
    )
    with deployment:
        for proc in deployment.processes:
            role = proc.name.split("-")[0]
            assert proc.env["MEGHA_AMQP_URL"] == urls[role], f"{proc.name} does not connect as {role}"
        settings = deployment.loadgen(LoadgenSettings(trace="demo", first_jobs=5, time_scale=0.00002, mode="slot"))
        assert settings.amqp_url == urls["loadgen"]
        run = asyncio.run(replay_services(settings))
    assert run.metrics is not None and run.metrics.tasks > 0
    assert run.timed_out == [] and run.metrics.not_exactly_once == ()
    assert run.metrics.tasks_completed == run.metrics.tasks, run.metrics
    assert all(r.completions == 1 for r in run.tasks.values())


async def _refused(url: str, action: Action) -> str:
    """The ACCESS_REFUSED error the broker answers `action` on a channel of the user of `url` with."""
    connection = await aio_pika.connect(url, timeout=5)
    try:
        channel = await connection.channel(publisher_confirms=True)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as refused:
            await action(channel)
        return str(refused.value)
    finally:
        await connection.close()


async def _allowed(url: str, action: Action) -> None:
    connection = await aio_pika.connect(url, timeout=5)
    try:
        await action(await connection.channel(publisher_confirms=True))
    finally:
        await connection.close()


async def _ack(message: AbstractIncomingMessage) -> None:
    await message.ack()


def _consume(queue: str) -> Action:
    async def action(channel: AbstractChannel) -> object:
        found = await channel.get_queue(queue, ensure=True)  # a passive declare: no permission needed
        return await found.consume(_ack)

    return action


def _publish(exchange: str, key: str) -> Action:
    async def action(channel: AbstractChannel) -> object:
        found = await channel.get_exchange(exchange, ensure=True)
        return await found.publish(aio_pika.Message(b'{"delta": null}'), routing_key=key)

    return action


def _delete_exchange(exchange: str) -> Action:
    async def action(channel: AbstractChannel) -> object:
        return await channel.exchange_delete(exchange)

    return action


def _delete_queue(queue: str) -> Action:
    async def action(channel: AbstractChannel) -> object:
        return await channel.queue_delete(queue)

    return action


def test_each_role_is_refused_what_it_must_not_do(users: tuple[str, dict[str, str]]) -> None:
    run_id, urls = users
    gm_queue, lm_queue = f"{run_id}.{gm_key(0)}", f"{run_id}.{lm_key(0)}"

    async def check() -> None:
        # Each role's own broker, as the services make it, sets up its part of the topology with its own user.
        brokers = {role: Broker(urls[role], run_id, role=role, connect_timeout=10.0) for role in BROKER_ROLES}
        for broker in brokers.values():
            await broker.connect()

        async def ignore(body: bytes) -> None:
            return None

        try:
            await brokers["gm"].consume("gm", gm_key(0), ignore)
            await brokers["lm"].consume("lm", lm_key(0), ignore)
            await brokers["worker"].publish("lm", lm_key(0), b"{}")  # declares and binds the LM's queue
            await brokers["lm"].publish("gm", gm_key(0), b"{}")
            for broker in brokers.values():
                assert await broker.flush(10.0), "a role's own publish was not confirmed"
        finally:
            for broker in brokers.values():
                await broker.close(flush_timeout=1.0)

        # What a role does is allowed (the checks below could fail) ...
        await _allowed(urls["gm"], _consume(gm_queue))
        await _allowed(urls["lm"], _publish(f"{run_id}.gm", gm_key(0)))
        await _allowed(urls["worker"], _publish(f"{run_id}.lm", lm_key(0)))
        # ... and what it must not do is refused.
        refusals = {
            "an LM reads a GM's queue": (urls["lm"], _consume(gm_queue)),
            "a worker reads a GM's queue": (urls["worker"], _consume(gm_queue)),
            "a worker reads an LM's queue": (urls["worker"], _consume(lm_queue)),
            "the load generator reads an LM's queue": (urls["loadgen"], _consume(lm_queue)),
            "the load generator publishes a delta": (urls["loadgen"], _publish(f"{run_id}.gm", gm_key(0))),
            "a worker publishes a delta": (urls["worker"], _publish(f"{run_id}.gm", gm_key(0))),
            "a GM publishes to an LM": (urls["gm"], _publish(f"{run_id}.lm", lm_key(0))),
            "a worker publishes to the dead letters": (urls["worker"], _publish(f"{run_id}.dead", "")),
            "a worker deletes the GMs' exchange": (urls["worker"], _delete_exchange(f"{run_id}.gm")),
            "the load generator deletes a GM's queue": (urls["loadgen"], _delete_queue(gm_queue)),
            "a GM deletes an LM's queue": (urls["gm"], _delete_queue(lm_queue)),
            "a GM reaches another run's queue": (urls["gm"], _consume(f"other-{run_id}.{gm_key(0)}")),
        }
        for what, (url, action) in refusals.items():
            if what.endswith("another run's queue"):
                await _allowed(AMQP, lambda channel: channel.declare_queue(f"other-{run_id}.{gm_key(0)}"))
            error = await _refused(url, action)
            assert "ACCESS_REFUSED" in error, f"{what}: {error}"
        await _allowed(AMQP, _delete_queue(f"other-{run_id}.{gm_key(0)}"))

    asyncio.run(check())
