"""RabbitMQ transport for the services (aio-pika): topology, confirmed publishing that survives broker outages,
and consumers that never drop a message.

The topology (exchanges `<run>.gm`, `<run>.lm`, `<run>.events`, `<run>.dead`, their queues and messages) is in
docs/topology.md; which queue type (classic or quorum) to choose, and why, is in docs/reliability.md.

* **Publishing** goes through an outbox: `publish` appends the message (waiting only while the outbox holds
  `outbox_bytes`, so memory stays bounded and nothing is dropped) and a sender task publishes it with publisher
  confirms. A message the broker did not confirm (it is away, or the connection dropped) stays at the head of the
  outbox and is sent again once the robust connection is back: delivery is at least once, in order per
  publisher, and every consumer of Megha's messages is idempotent (versioned node states, per-task completions).
* **Consuming** acks after the handler has applied the message; a handler once started runs to its end even when
  the channel closes under it (then the message comes again, and handlers are idempotent). A handler that raises
  `TryLater` (say, an LM still rebuilding its cluster) has the message requeued after a pause; any other failure
  requeues it too, up to `delivery_limit` times, and then the message goes to `<run>.dead-letters` where an
  operator can read it. A body that is not valid JSON of the expected model goes there at once. Nothing is
  dropped.
* **Connecting** retries with backoff, logging what it waits for, and gives up after `connect_timeout` seconds
  with one clear `BrokerUnavailable` line.
* **Signed reports.** A worker agent signs each report it sends its LM (`report_headers`: HMAC-SHA256 with a key
  its LM derived for it, `report_key`); the LM checks the signature (`report_sender`) and which nodes the signer
  holds (docs/security.md, "Broker reports"). An LM signs each message it sends a GM with its own credential
  (`lm_report_headers`: Ed25519, its certificate beside); the GM checks it (`lm_report_signer`) and that the
  message is about the signer. What either ignores is counted and logged sparingly (`IgnoredMessages`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import itertools
import logging
import ssl
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aio_pika
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustChannel, AbstractRobustConnection
from pydantic import ValidationError

from megha.common.auth import Unauthenticated
from megha.common.lifecycle import StartupError, check_stop, exit_on_startup_error

if TYPE_CHECKING:
    from megha.common.auth import MessageSigner, MessageVerifier

log = logging.getLogger(__name__)

Handler = Callable[[bytes], Awaitable[None]]
HeadersHandler = Callable[[bytes, Mapping[str, object]], Awaitable[None]]
"""A handler that also reads the message's headers (`Broker.consume(..., headers=True)`)."""
Headers = dict[str, str]

OUTBOX_BYTES = 64 * 1024 * 1024
"""Default bound of the messages a publisher holds while the broker is away (MEGHA_OUTBOX_BYTES)."""
PUBLISH_WINDOW = 64
"""Messages the sender has awaiting their confirms at once."""
PUBLISH_TIMEOUT = 10.0
"""Seconds to wait for one confirm before the message counts as not delivered (and is sent again)."""

PEEK_LIMIT = 100_000
PEEK_BYTES = 256 << 20
"""At most this many messages, of at most about this many bytes together, are read by `Broker.peek`."""
DELIVERY_LIMIT = 20
"""Failed deliveries of one message before it is dead-lettered (its handler kept failing)."""
RETRY_PAUSE = 0.5
"""Seconds a message whose handler failed waits before it is requeued."""

DIRECT_EXCHANGES = ("gm", "lm")
EXCHANGES = (*DIRECT_EXCHANGES, "events", "dead")


class BrokerUnavailable(StartupError):
    """RabbitMQ could not be reached within the configured time; the message says where and why."""


class TryLater(Exception):
    """Raised by a handler that cannot apply its message yet: the message is requeued after a pause."""


def gm_key(gm: int) -> str:
    return f"gm.{gm}"


def lm_key(lm: int) -> str:
    return f"lm.{lm}"


REPORT_SENDER = "megha-worker"
"""Header of a worker agent's report to its LM: the id of the agent that signed it."""
REPORT_SIGNATURE = "megha-signature"
"""Header of a worker agent's report to its LM: `report_signature` of it, in hex."""
LM_CERTIFICATE = "megha-lm-certificate"
"""Header of an LM's message to a GM: the LM's certificate (`MessageSigner.certificate`)."""
LM_SIGNATURE = "megha-lm-signature"
"""Header of an LM's message to a GM: the LM's Ed25519 signature of `lm_report_bytes` of it, base64."""


def _header(headers: Mapping[str, object], name: str) -> str | None:
    """Header `name` as text (None when absent or not text; AMQP may hand text over as bytes)."""
    value = headers.get(name)
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value if isinstance(value, str) else None


def report_key(report_secret: bytes, worker_id: str) -> bytes:
    """The key agent `worker_id` signs its reports to an LM with: HMAC-SHA256(the LM's report secret, worker id).
    Only the LM (which holds the secret) and that agent (which the LM tells at registration) know it."""
    return hmac.digest(report_secret, worker_id.encode(), "sha256")


def report_signature(key: bytes, lm: int, worker_id: str, body: bytes) -> bytes:
    """HMAC-SHA256 with `key` over b"megha-report1 lm <lm> worker <worker id>\n" followed by the message body:
    a signed report is bound to its sender and to the LM it was meant for (a copy sent to another LM fails)."""
    return hmac.digest(key, b"megha-report1 lm %d worker %s\n%s" % (lm, worker_id.encode(), body), "sha256")


def report_headers(key: bytes, lm: int, worker_id: str, body: bytes) -> Headers:
    """The headers that sign a report `body` agent `worker_id` sends LM `lm`."""
    return {REPORT_SENDER: worker_id, REPORT_SIGNATURE: report_signature(key, lm, worker_id, body).hex()}


def report_sender(headers: Mapping[str, object]) -> str | None:
    """The agent a report's headers name as its signer (None when they name none); not yet checked."""
    return _header(headers, REPORT_SENDER)


def report_signed_by(key: bytes, lm: int, worker_id: str, body: bytes, headers: Mapping[str, object]) -> bool:
    """Whether `headers` carry a valid signature of `body` by `worker_id` (whose key is `key`) for LM `lm`."""
    signature = _header(headers, REPORT_SIGNATURE)
    if signature is None:
        return False
    return hmac.compare_digest(signature, report_signature(key, lm, worker_id, body).hex())


def lm_report_bytes(lm: str, gm: int, body: bytes) -> bytes:
    """What an LM signs of a message `body` to GM `gm`: b"megha-lm-report1 lm <lm> gm <gm>\n" followed by the
    body's exact bytes, so a signed message is bound to its LM and to the GM it was meant for."""
    return b"megha-lm-report1 lm %s gm %d\n%s" % (lm.encode(), gm, body)


def lm_report_headers(signer: MessageSigner, gm: int, body: bytes) -> Headers:
    """The headers that sign a message `body` the LM of `signer` sends GM `gm`."""
    return {LM_CERTIFICATE: signer.certificate, LM_SIGNATURE: signer.sign(lm_report_bytes(signer.ident, gm, body))}


def lm_report_signer(verifier: MessageVerifier, gm: int, body: bytes, headers: Mapping[str, object]) -> str:
    """The id of the LM that signed `body` for GM `gm` (its certificate and signature in `headers`);
    Unauthenticated says why no LM did."""
    certificate, signature = _header(headers, LM_CERTIFICATE), _header(headers, LM_SIGNATURE)
    if certificate is None or signature is None:
        raise Unauthenticated("it is not signed")
    return verifier.signer(certificate, signature, lambda lm: lm_report_bytes(lm, gm, body))


IGNORED_LOG_EVERY = 60.0
"""Seconds between two log lines about ignored broker messages claiming the same sender (a flood of forged messages
costs one line a minute per claimed sender, with the count of those not logged)."""
IGNORED_SENDERS_KEPT = 1024
"""Claimed senders whose last log line a consumer remembers; messages claiming any further one share one line."""


class IgnoredMessages:
    """The count of the broker messages (or parts of them) a consumer ignored, unsigned or forged, and when to log
    them: at once for a claimed sender not logged in the last IGNORED_LOG_EVERY seconds, else with the next line
    about it (a flood is not a flood of lines)."""

    def __init__(self) -> None:
        self.count = 0
        self._logged: dict[str, tuple[float, int]] = {}  # claimed sender -> (last logged, ignored since)

    def due(self, claimed: str) -> str | None:
        """Count one ignored message claiming to come from `claimed`. Returns the end of the log line to write
        about it now ("" or "; N more ignored since the last such line"), or None when no line is due."""
        self.count += 1
        now = time.monotonic()
        sender = claimed if claimed in self._logged or len(self._logged) < IGNORED_SENDERS_KEPT else "*"
        last, unlogged = self._logged.get(sender, (-IGNORED_LOG_EVERY, 0))
        if now - last < IGNORED_LOG_EVERY:
            self._logged[sender] = (last, unlogged + 1)
            return None
        self._logged[sender] = (now, 0)
        return f"; {unlogged} more ignored since the last such line" if unlogged else ""


BROKER_ROLES = ("gm", "lm", "worker", "loadgen")
"""The roles that connect to RabbitMQ, each as a user of its own (docs/security.md, "Broker users")."""
ROLE_EXCHANGES: dict[str, tuple[str, ...]] = {
    "gm": ("gm", "events", "dead"),
    "lm": ("gm", "lm", "events", "dead"),
    "worker": ("lm", "events"),
    "loadgen": ("events", "dead"),
}
"""The exchanges a role's broker declares: those it binds its queues to or publishes to. A role that consumes
(all but the worker agent) also declares `<run>.dead-letters`, where it may dead-letter a message."""


def broker_user(run_id: str, role: str) -> str:
    """The RabbitMQ user of `role` in run `run_id`."""
    return f"{run_id}-{role}"


def broker_permissions(run_id: str) -> dict[str, tuple[str, str, str]]:
    """Each role's configure, write and read permissions (RabbitMQ regular expressions over exchange and queue
    names) in run `run_id`: what it declares, what it publishes to or binds a queue to, what it consumes or binds
    from. A publisher declares and binds the queue it sends to (no message may find no queue), so it may configure
    and write that queue, never read it."""
    run = run_id.replace(".", r"\.")

    def names(*alternatives: str) -> str:
        return rf"^{run}\.({'|'.join(alternatives)})$"

    gm_queues, lm_queues, loadgen_queue, dead = r"gm\.\d+", r"lm\.\d+", r"events\.loadgen-[0-9a-f]+", "dead"
    return {
        "gm": (
            names("gm", "events", dead, "dead-letters", gm_queues),
            names("events", dead, "dead-letters", gm_queues),
            names("gm", dead, gm_queues),
        ),
        "lm": (
            names("gm", "lm", "events", dead, "dead-letters", gm_queues, lm_queues),
            names("gm", "events", dead, "dead-letters", gm_queues, lm_queues),
            names("gm", "lm", dead, lm_queues),
        ),
        "worker": (names("lm", "events", lm_queues), names("lm", "events", lm_queues), names("lm")),
        "loadgen": (
            names("events", dead, "dead-letters", loadgen_queue),
            names(dead, "dead-letters", loadgen_queue),
            names("events", dead, loadgen_queue),
        ),
    }


def loadgen_queue(run_id: str) -> str:
    """A fresh name for a load generator's queue of task events (its user may consume only such queues)."""
    return f"{run_id}.events.loadgen-{uuid.uuid4().hex[:8]}"


def safe_url(url: str) -> str:
    """The broker URL without its password, for logs."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    user = f"{parts.username}@" if parts.username else ""
    return f"{parts.scheme}://{user}{host}{port}{parts.path}"


AMQP_HEARTBEAT = 5
"""Seconds of the AMQP heartbeat the services ask for unless their URL names one (`?heartbeat=`). RabbitMQ's default
of 60 s leaves a connection whose peer vanished (a network cut, not a close) looking alive for minutes while Linux
retransmits into it; with 5 s aio-pika drops it after about 18 s of silence and reconnects as soon as the broker can
be reached again (docs/reliability.md, the container chaos matrix)."""


def with_heartbeat(url: str, seconds: int = AMQP_HEARTBEAT) -> str:
    """`url` asking for an AMQP heartbeat of `seconds`, unless it already names one."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(key == "heartbeat" for key, _ in query):
        return url
    return urlunsplit(parts._replace(query=urlencode([*query, ("heartbeat", str(seconds))])))


def queue_arguments(queue_type: str) -> dict[str, object]:
    """Every queue Megha consumes is durable, of type `queue_type` ("classic" or "quorum": docs/reliability.md says
    which to choose). Counting deliveries is the consumer's, so both types dead-letter alike."""
    return {"x-queue-type": queue_type} if queue_type != "classic" else {}


class Broker:
    """One robust connection and channel, the run's topology, an outbox for confirmed publishing, consumers."""

    def __init__(
        self,
        url: str,
        run_id: str = "megha",
        *,
        outbox_bytes: int = OUTBOX_BYTES,
        connect_timeout: float = 60.0,
        delivery_limit: int = DELIVERY_LIMIT,
        retry_pause: float = RETRY_PAUSE,
        queue_type: str = "classic",
        role: str | None = None,
        tls_ca: str | None = None,
    ) -> None:
        self.url = url
        self.exchanges = EXCHANGES if role is None else ROLE_EXCHANGES[role]
        self.tls_ca = tls_ca
        self.delivery_limit = delivery_limit
        self.retry_pause = retry_pause
        self.queue_type = queue_type
        self._failures: dict[str, int] = {}  # message id -> failed deliveries to this consumer
        self._message_ids = itertools.count()
        self._publisher_id = uuid.uuid4().hex[:12]
        self.run_id = run_id
        self.outbox_bytes = outbox_bytes
        self.connect_timeout = connect_timeout
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractRobustChannel | None = None
        self._exchanges: dict[str, aio_pika.abc.AbstractExchange] = {}
        self._declared: dict[str, aio_pika.abc.AbstractQueue] = {}
        self._consumers: dict[str, str] = {}  # queue name -> consumer tag
        self._handling: dict[str, int] = {}  # queue name -> its messages taken by a consumer and not yet settled
        # (exchange, routing key, body, headers, the future `publish_confirmed` awaits or None)
        self._outbox: deque[tuple[str, str, bytes, Headers | None, asyncio.Future[None] | None]] = deque()
        self._outbox_size = 0
        self._changed = asyncio.Condition()
        self._in_flight = 0
        self._sender: asyncio.Task[None] | None = None
        self._closing = False
        self._lost_since: float | None = None  # monotonic time the connection was lost, while it is
        self.published = 0
        self.publish_failures = 0  # publishes not confirmed (then sent again)
        self.dead_lettered = 0
        self.requeued = 0

    # ------------------------------------------------------------ connection

    async def connect(self, timeout: float | None = None) -> None:
        """Connect and declare the topology, retrying with backoff for up to `timeout` seconds (default
        `connect_timeout`); raises BrokerUnavailable with one line saying where and why."""
        timeout = self.connect_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        pause, attempt = 0.25, 0
        while True:
            attempt += 1
            try:
                self._connection = await aio_pika.connect_robust(
                    with_heartbeat(self.url), reconnect_interval=1, timeout=5, ssl_context=self._tls_context()
                )
                break
            except Exception as exc:  # aiormq raises a variety of socket and AMQP errors
                check_stop(f"RabbitMQ at {safe_url(self.url)}")
                reason = str(exc) or type(exc).__name__
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrokerUnavailable(
                        f"RabbitMQ unreachable at {safe_url(self.url)} for {timeout:g} s ({attempt} attempts): {reason}"
                    ) from None
                log.warning(
                    "waiting for RabbitMQ at %s (attempt %d, giving up in %g s): %s",
                    safe_url(self.url),
                    attempt,
                    round(left),
                    reason,
                )
                until = time.monotonic() + min(pause, left)
                while time.monotonic() < until:  # a signal ends the wait at once
                    check_stop(f"RabbitMQ at {safe_url(self.url)}")
                    await asyncio.sleep(0.1)
                pause = min(pause * 2, 5.0)
        self._connection.close_callbacks.add(self._on_lost)
        self._connection.reconnect_callbacks.add(self._on_reconnected)
        self._channel = await self._connection.channel(publisher_confirms=True)
        await self._channel.set_qos(prefetch_count=256)
        for name in self.exchanges:
            kind = aio_pika.ExchangeType.DIRECT if name in DIRECT_EXCHANGES else aio_pika.ExchangeType.FANOUT
            self._exchanges[name] = await self._channel.declare_exchange(f"{self.run_id}.{name}", kind, durable=True)
        if "dead" in self._exchanges:
            dead = await self._channel.declare_queue(
                f"{self.run_id}.dead-letters", durable=True, arguments=queue_arguments(self.queue_type)
            )
            await dead.bind(self._exchanges["dead"])
            self._declared[dead.name] = dead
        self._sender = asyncio.get_running_loop().create_task(self._send_forever())

    def _tls_context(self) -> ssl.SSLContext | None:
        """For an amqps:// URL: TLS verifying the broker with `tls_ca` (MEGHA_TLS_CA), or the system's CAs."""
        if urlsplit(self.url).scheme != "amqps":
            return None
        return ssl.create_default_context(cafile=self.tls_ca)

    def _on_lost(self, *args: object) -> None:
        """Say once per outage that the connection is gone (aio-pika calls this again on every failed attempt to
        reconnect, once a second while the broker is away)."""
        if self._closing or self._lost_since is not None:
            return
        self._lost_since = time.monotonic()
        log.warning(
            "connection to RabbitMQ at %s lost; reconnecting (publishes wait in the outbox)", safe_url(self.url)
        )

    def _on_reconnected(self, *args: object) -> None:
        away = "" if self._lost_since is None else f" after {time.monotonic() - self._lost_since:.1f} s"
        self._lost_since = None
        log.info("reconnected to RabbitMQ at %s%s; %d messages to resend", safe_url(self.url), away, len(self._outbox))

    async def close(self, flush_timeout: float = 5.0) -> None:
        """Send what the outbox holds (for up to `flush_timeout` seconds), then disconnect."""
        if self._connection is None:
            return
        self._closing = True
        if not await self.flush(flush_timeout):
            log.error("closing with %d messages not delivered to RabbitMQ at %s", len(self._outbox), safe_url(self.url))
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
        with contextlib.suppress(Exception):
            await self._connection.close()
        self._connection = None

    # ------------------------------------------------------------ publishing

    async def publish(self, exchange: str, routing_key: str, body: bytes, headers: Headers | None = None) -> None:
        """Queue a persistent JSON message for `exchange` ("gm", "lm" or "events"), with `headers` if given. Returns
        once it is in the outbox; waits while the outbox is full (the broker has been away long), never drops it."""
        await self._enqueue(exchange, routing_key, body, headers, None)

    async def publish_confirmed(
        self, exchange: str, routing_key: str, body: bytes, headers: Headers | None = None
    ) -> None:
        """`publish`, returning only once the broker has confirmed the message. A handler that publishes what
        follows from a message it consumes this way is acked after the broker holds the result: killed before,
        the message comes again (the outbox is in memory and dies with the process)."""
        confirmed = asyncio.get_running_loop().create_future()
        await self._enqueue(exchange, routing_key, body, headers, confirmed)
        await confirmed

    async def _enqueue(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        headers: Headers | None,
        confirmed: asyncio.Future[None] | None,
    ) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._outbox_size + len(body) <= self.outbox_bytes or not self._outbox)
            self._outbox.append((exchange, routing_key, body, headers, confirmed))
            self._outbox_size += len(body)
            self._changed.notify_all()

    async def flush(self, timeout: float) -> bool:
        """Wait until every queued message is confirmed; False if that took more than `timeout` seconds."""
        try:
            async with asyncio.timeout(timeout):
                async with self._changed:
                    await self._changed.wait_for(lambda: not self._outbox and not self._in_flight)
        except TimeoutError:
            return False
        return True

    @property
    def pending(self) -> int:
        """Messages not yet confirmed by the broker."""
        return len(self._outbox) + self._in_flight

    async def _send_forever(self) -> None:
        """Publish the outbox's head window with confirms; what was not confirmed goes back to the head, in order,
        and is sent again after a pause (the robust connection reconnects meanwhile)."""
        pause = 0.1
        outage_logged = False
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda: bool(self._outbox))
                window = [self._outbox.popleft() for _ in range(min(PUBLISH_WINDOW, len(self._outbox)))]
                self._in_flight = len(window)
            results = await asyncio.gather(*(self._publish_one(*m[:4]) for m in window), return_exceptions=True)
            failed = [m for m, r in zip(window, results) if r is not None]
            for m, r in zip(window, results):
                if r is None and m[4] is not None and not m[4].done():
                    m[4].set_result(None)
            async with self._changed:
                self._in_flight = 0
                self._outbox.extendleft(reversed(failed))
                self._outbox_size -= sum(len(m[2]) for m in window) - sum(len(m[2]) for m in failed)
                self.published += len(window) - len(failed)
                self._changed.notify_all()
            if failed:
                self.publish_failures += len(failed)
                if not outage_logged:
                    error = next(r for r in results if r is not None)
                    log.warning(
                        "RabbitMQ at %s did not confirm %d messages (%s); holding %d until it is back",
                        safe_url(self.url),
                        len(failed),
                        str(error) or type(error).__name__,
                        len(self._outbox),
                    )
                    outage_logged = True
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)
            elif outage_logged:
                log.info(
                    "RabbitMQ at %s confirms again; %d messages still queued", safe_url(self.url), len(self._outbox)
                )
                outage_logged, pause = False, 0.1

    async def _publish_one(self, exchange: str, routing_key: str, body: bytes, headers: Headers | None) -> None:
        if exchange in DIRECT_EXCHANGES:
            await self._declare(exchange, routing_key)  # a message must never find no queue
        message = aio_pika.Message(
            body,
            headers=cast("dict[str, Any]", headers),  # str values are AMQP field values (aio-pika's dict is invariant)
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=f"{self._publisher_id}-{next(self._message_ids)}",
        )
        await self._exchanges[exchange].publish(
            message,
            routing_key=routing_key,
            mandatory=False,
            timeout=PUBLISH_TIMEOUT,
        )

    # ------------------------------------------------------------- consuming

    async def _declare(self, exchange: str, routing_key: str, queue: str | None = None) -> aio_pika.abc.AbstractQueue:
        """Declare (once per broker object) the durable queue of `routing_key` on `exchange` and bind it."""
        assert self._channel is not None, "connect() first"
        name = queue or f"{self.run_id}.{routing_key}"
        q = self._declared.get(name)
        if q is None:
            q = await self._channel.declare_queue(name, durable=True, arguments=queue_arguments(self.queue_type))
            await q.bind(self._exchanges[exchange], routing_key=routing_key)
            self._declared[name] = q
        return q

    async def consume(
        self,
        exchange: str,
        routing_key: str,
        handler: Handler | HeadersHandler,
        queue: str | None = None,
        *,
        headers: bool = False,
    ) -> str:
        """Bind a queue to `exchange` and feed each message body to `handler`, acking after it returns; with
        `headers`, the message's headers too (a `HeadersHandler`).

        `queue` None makes the queue `<run>.<routing_key>`; pass a name for the events fanout."""
        q = await self._declare(exchange, routing_key, queue)
        name = q.name

        async def on_message(message: AbstractIncomingMessage) -> None:
            self._handling[name] = self._handling.get(name, 0) + 1  # until acked or given back (`backlog`)
            try:
                await handle(message)
            finally:
                self._handling[name] -= 1

        async def handle(message: AbstractIncomingMessage) -> None:
            try:
                # Shielded: aiormq cancels its consumer callbacks when their channel closes (the broker went
                # away), and a handler cut off between changing state and publishing what follows from it would
                # lose that for good (the message comes again, but finds the change made). It runs to its end
                # instead; the ack is lost with the channel, and the redelivered copy finds nothing left to do.
                work = asyncio.ensure_future(
                    handler(message.body, message.headers) if headers else handler(message.body)  # type: ignore[call-arg]
                )
                try:
                    await asyncio.shield(work)
                except asyncio.CancelledError:
                    work.add_done_callback(functools.partial(_log_outcome, name))
                    raise
            except TryLater as exc:
                log.info("requeueing a message on %s: %s", name, exc)
                await self._requeue(message)
            except ValidationError as exc:
                log.error("dead-lettering a malformed message on %s: %s", name, str(exc).splitlines()[0])
                await self._dead_letter(message)
            except Exception:
                key = message.message_id or ""
                failures = self._failures[key] = self._failures.get(key, 0) + 1
                if failures >= self.delivery_limit:
                    log.exception("a handler on %s failed %d times; dead-lettering the message", name, failures)
                    self._failures.pop(key, None)
                    await self._dead_letter(message)
                else:
                    self.requeued += 1
                    log.exception("a handler on %s failed (%d of %d); requeueing", name, failures, self.delivery_limit)
                    await self._requeue(message)
            else:
                if self._failures:
                    self._failures.pop(message.message_id or "", None)
                with contextlib.suppress(Exception):  # a lost channel redelivers the message: handlers are idempotent
                    await message.ack()

        self._consumers[name] = await q.consume(on_message)
        return name

    async def _requeue(self, message: AbstractIncomingMessage) -> None:
        """Give the message back to its queue after `retry_pause` seconds (a lost channel does that by itself)."""
        await asyncio.sleep(self.retry_pause)
        with contextlib.suppress(Exception):
            await message.nack(requeue=True)

    async def _dead_letter(self, message: AbstractIncomingMessage) -> None:
        """Move a message to `<run>.dead-letters` (through the outbox, so it is kept) and ack the original."""
        self.dead_lettered += 1
        await self.publish("dead", "", message.body)
        with contextlib.suppress(Exception):
            await message.ack()

    async def backlog(self, exchange: str, routing_key: str) -> int:
        """The messages of the queue of `routing_key` on `exchange` not yet settled: those waiting in it and those a
        consumer here took and is handling or giving back (0: every message that had waited was handled)."""
        q = await self._declare(exchange, routing_key)
        ok = await q.declare(timeout=PUBLISH_TIMEOUT)
        return (ok.message_count or 0) + self._handling.get(q.name, 0)

    async def peek(self, exchange: str, routing_key: str) -> list[tuple[bytes, Headers]]:
        """The messages waiting in the queue of `routing_key` on `exchange` (at most PEEK_LIMIT of them, PEEK_BYTES
        together), with their headers, left in the queue: each is taken unacknowledged, and all are given back
        (in their order) once read, for the consumer that comes next. Messages a consumer of the queue holds are
        not seen. A service that restarts reads so what waited for it before it handles any of it."""
        q = await self._declare(exchange, routing_key)
        held: list[AbstractIncomingMessage] = []
        size = 0
        try:
            while len(held) < PEEK_LIMIT and size < PEEK_BYTES:
                message = await q.get(no_ack=False, fail=False, timeout=PUBLISH_TIMEOUT)
                if message is None:
                    break
                held.append(message)
                size += len(message.body)
        finally:
            for message in held:
                with contextlib.suppress(Exception):  # a lost channel gives them back by itself
                    await message.nack(requeue=True)
        return [(m.body, cast("Headers", dict(m.headers or {}))) for m in held]

    async def stop_consuming(self, name: str) -> None:
        """Stop feeding queue `name` to its handler; the queue keeps its messages for another consumer (messages
        being handled still end as the handler says: a `TryLater` gives them back)."""
        q, tag = self._declared.get(name), self._consumers.pop(name, None)
        if q is not None and tag is not None:
            with contextlib.suppress(Exception):
                await q.cancel(tag)

    async def delete_queue(self, name: str) -> None:
        """Stop consuming `name` (so the broker has no consumer to cancel) and delete it."""
        assert self._channel is not None
        await self.stop_consuming(name)
        self._declared.pop(name, None)
        await self._channel.queue_delete(name)

    async def delete_run(self, routing_keys: list[str]) -> None:
        """Remove a finished run's queues (`<run>.<key>` for each key, and its dead letters) and exchanges."""
        assert self._channel is not None
        for name in [f"{self.run_id}.{key}" for key in routing_keys] + [f"{self.run_id}.dead-letters"]:
            with contextlib.suppress(Exception):
                await self._channel.queue_delete(name)
        for name in EXCHANGES:
            with contextlib.suppress(Exception):
                await self._channel.exchange_delete(f"{self.run_id}.{name}")


def _log_outcome(queue: str, work: asyncio.Future[None]) -> None:
    """How a handler that went on after its channel closed ended (its message comes again either way)."""
    if work.cancelled():
        return
    if (error := work.exception()) is not None:
        log.warning("a handler on %s failed after its channel closed (the message comes again): %r", queue, error)


@asynccontextmanager
async def connected(broker: Broker | None) -> AsyncIterator[None]:
    """Keep `broker` connected for the block (a service built without a broker, in tests, passes None)."""
    if broker is None:
        yield
        return
    try:
        await broker.connect()
    except StartupError as exc:  # unreachable for MEGHA_BROKER_TIMEOUT, or a signal while waiting
        exit_on_startup_error(exc)
    try:
        yield
    finally:
        await broker.close()


async def run_background(name: str, step: Callable[[], Awaitable[None]], every: float) -> None:
    """Call `step` every `every` seconds until cancelled. An exception is logged and the loop goes on: a
    background loop (heartbeats, liveness checks) never dies silently."""
    while True:
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s failed; trying again in %.1f s", name, every)
        await asyncio.sleep(every)
