"""RabbitMQ transport for the services (aio-pika): exchanges, queues and routing keys, publish and consume.

The topology (exchanges `<run>.gm`, `<run>.lm`, `<run>.events`, their queues and messages) is documented in
docs/topology.md. Exchanges and the GM and LM queues are durable and messages persistent: losing one would lose a
completion. Consumers ack explicitly after the handler has applied the message; a message whose handler fails is
logged and rejected without requeue (a poison message must not loop forever).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aio_pika
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustChannel, AbstractRobustConnection

log = logging.getLogger(__name__)

Handler = Callable[[bytes], Awaitable[None]]


def gm_key(gm: int) -> str:
    return f"gm.{gm}"


def lm_key(lm: int) -> str:
    return f"lm.{lm}"


class Broker:
    """One robust connection and channel; declares the topology on connect."""

    def __init__(self, url: str, run_id: str = "megha") -> None:
        self.url = url
        self.run_id = run_id
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractRobustChannel | None = None
        self._exchanges: dict[str, aio_pika.abc.AbstractExchange] = {}

    async def connect(self) -> None:
        self._connection = await aio_pika.connect_robust(self.url)
        self._channel = await self._connection.channel()  # type: ignore[assignment]
        await self._channel.set_qos(prefetch_count=256)
        for name, kind in (
            ("gm", aio_pika.ExchangeType.DIRECT),
            ("lm", aio_pika.ExchangeType.DIRECT),
            ("events", aio_pika.ExchangeType.FANOUT),
        ):
            self._exchanges[name] = await self._channel.declare_exchange(f"{self.run_id}.{name}", kind, durable=True)

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = None

    async def publish(self, exchange: str, routing_key: str, body: bytes) -> None:
        """Publish a persistent JSON message to `exchange` ("gm", "lm" or "events")."""
        await self._exchanges[exchange].publish(
            aio_pika.Message(body, content_type="application/json", delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key=routing_key,
        )

    async def consume(self, exchange: str, routing_key: str, handler: Handler, queue: str | None = None) -> str:
        """Bind a queue to `exchange` and feed each message body to `handler`, acking after it returns.

        `queue` None makes a durable queue named `<run>.<routing_key>`; pass a name for the events fanout."""
        assert self._channel is not None, "connect() first"
        name = queue or f"{self.run_id}.{routing_key}"
        q = await self._channel.declare_queue(name, durable=True)
        await q.bind(self._exchanges[exchange], routing_key=routing_key)

        async def on_message(message: AbstractIncomingMessage) -> None:
            try:
                await handler(message.body)
            except Exception:
                log.exception("dropping a message on %s that its handler could not apply", name)
                await message.reject(requeue=False)
            else:
                await message.ack()

        await q.consume(on_message)
        return name

    async def delete_queue(self, name: str) -> None:
        assert self._channel is not None
        await self._channel.queue_delete(name)


@asynccontextmanager
async def connected(broker: Broker | None) -> AsyncIterator[None]:
    """Keep `broker` connected for the block (a service built without a broker, in tests, passes None)."""
    if broker is None:
        yield
        return
    await broker.connect()
    try:
        yield
    finally:
        await broker.close()
