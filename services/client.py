"""Calls between the services (GM -> LM -> worker agent): a small HTTP/1.1 client with JSON bodies over
kept-alive connections, which sends a request again only when its caller says it is idempotent."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import NamedTuple
from urllib.parse import urlsplit


class CallError(Exception):
    """A call to another service failed in transport: no connection, a reset or closed connection, a timeout, or
    an answer that is not HTTP/1.1. Whether the request reached the service is unknown."""


class NotSent(CallError):
    """A CallError before any byte of the request left: no connection could be opened (refused, no route, a name
    that does not resolve). The service did not get the request."""


class Reply(NamedTuple):
    status: int
    body: bytes
    head: bytes = b""  # the status line and headers as received, parsed only when a header is asked for

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def header(self, name: str) -> str | None:
        """The value of header `name` (any case), None when the answer has none."""
        wanted = name.lower().encode()
        for line in self.head.split(b"\r\n")[1:]:
            key, colon, value = line.partition(b":")
            if colon and key.strip().lower() == wanted:
                return value.strip().decode(errors="replace")
        return None


_Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]

_tls_ca: str | None = None


def use_tls_ca(path: str | None) -> None:
    """The PEM bundle of certificate authorities with which this process's `ServiceClient`s made from now on verify
    https:// services (MEGHA_TLS_CA; None or empty: the system's)."""
    global _tls_ca
    _tls_ca = path or None


class ServiceClient:
    """HTTP/1.1 calls with JSON bodies between the services (GM -> LM -> worker agent), over kept-alive connections.

    A launch takes two such calls on the path of allocation time. httpx spent about 1.2 ms of CPU on each on this
    machine (its anyio, httpcore and h11 layers, headers and body in separate writes); this client writes a
    request in one write and reads the answer with two reads, for about 0.1 ms. It speaks what uvicorn answers:
    Content-Length or chunked bodies. A request is written before `request` first waits when an idle
    connection is at hand, so a caller can put a request on the wire before it does anything else.

    A kept-alive connection the server closed while idle fails the next request before any answer. The server may
    have acted on the request before closing, so it is sent again (once, on a new connection) only when the caller
    marks it idempotent (`idempotent=True`: a GET, or a call the service applies once however often it comes, such
    as a GM's launch batch, which the LM answers from its record of the runs it placed or saw end). Anything else
    fails with CallError, and its caller's retry policy (`megha.services.retry`) decides."""

    def __init__(self, timeout: float, keep_idle: int = 256, authorization: Callable[[], str] | None = None) -> None:
        """`timeout`: seconds for a whole call, connecting included. `keep_idle`: how many idle connections are
        kept open, over all the services called (an LM may call hundreds of agents). `authorization`: the
        `Authorization` header value of each call (a service's `Signer.header`; None: no header)."""
        self.timeout = timeout
        self._authorization = authorization
        self.keep_idle = keep_idle
        self._idle: dict[str, list[_Connection]] = {}
        self._idle_count = 0
        self._origins: dict[str, tuple[str, int, bool, bytes]] = {}
        self._tls: ssl.SSLContext | None = None

    async def post(self, url: str, body: bytes, idempotent: bool = False) -> Reply:
        return await self.request("POST", url, body, idempotent)

    async def get(self, url: str) -> Reply:
        return await self.request("GET", url, idempotent=True)

    async def request(self, method: str, url: str, body: bytes | None = None, idempotent: bool = False) -> Reply:
        """Call `url` (http or https); raises CallError for a transport failure, never for an HTTP status.
        `idempotent`: the request may be sent again when a kept-alive connection turns out closed."""
        origin, target = self._split(url)
        host, port, tls, host_header = self._origins[origin]
        head = [f"{method} {target} HTTP/1.1\r\n".encode(), b"host: ", host_header, b"\r\n"]
        if self._authorization is not None:
            head.append(b"authorization: %s\r\n" % self._authorization().encode())
        if body is not None:
            head.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
        message = b"".join([*head, b"\r\n", body or b""])
        wrote = False  # whether the request went out on some connection (it may then have reached the service)
        try:
            async with asyncio.timeout(self.timeout):
                conn = self._take(origin)
                if conn is not None:
                    wrote = True
                    try:
                        return await self._exchange(origin, conn, message)
                    except (ConnectionError, asyncio.IncompleteReadError):
                        if not idempotent:
                            raise
                        # closed by the server while idle: send again on a new connection
                conn = await asyncio.open_connection(host, port, ssl=self._tls_context() if tls else None)
                wrote = True
                return await self._exchange(origin, conn, message)
        except TimeoutError:
            if not wrote:
                raise NotSent(f"{method} {url}: no connection within {self.timeout} s") from None
            raise CallError(f"{method} {url}: no answer within {self.timeout} s") from None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            if not wrote and isinstance(exc, OSError):
                raise NotSent(f"{method} {url}: {exc!r}") from None
            raise CallError(f"{method} {url}: {exc!r}") from None

    def _split(self, url: str) -> tuple[str, str]:
        """(origin, request target) of `url`; the origin's address is parsed once."""
        scheme, _, rest = url.partition("://")
        netloc, slash, path = rest.partition("/")
        origin = f"{scheme}://{netloc}"
        if origin not in self._origins:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"not an http(s) URL: {url!r}")
            tls = parts.scheme == "https"
            self._origins[origin] = (parts.hostname, parts.port or (443 if tls else 80), tls, netloc.encode())
        return origin, slash + path if slash else "/"

    def _tls_context(self) -> ssl.SSLContext:
        """Verifies https:// services with the certificate authorities `use_tls_ca` named (the system's if none)."""
        if self._tls is None:
            self._tls = ssl.create_default_context(cafile=_tls_ca)
        return self._tls

    def _take(self, origin: str) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            reader, writer = idle.pop()
            self._idle_count -= 1
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return None

    async def _exchange(self, origin: str, conn: _Connection, message: bytes) -> Reply:
        reader, writer = conn
        try:
            writer.write(message)
            head = await reader.readuntil(b"\r\n\r\n")
            status, length, chunked, close = _parse_head(head)
            if chunked:
                body = await _read_chunked(reader)
            else:
                body = await reader.readexactly(length) if length else b""
        except BaseException:
            writer.close()
            raise
        if close or self._idle_count >= self.keep_idle:
            writer.close()
        else:
            self._idle.setdefault(origin, []).append(conn)
            self._idle_count += 1
        return Reply(status, body, head)

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for _, writer in idle:
                writer.close()
        self._idle.clear()
        self._idle_count = 0


def _parse_head(head: bytes) -> tuple[int, int, bool, bool]:
    """(status, content length, chunked, connection closes) of a response head; ValueError if it is not HTTP/1.1."""
    lines = head.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    if not version.startswith(b"HTTP/1."):
        raise ValueError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    status = int(rest[:3])
    length, chunked, close = 0, False, version == b"HTTP/1.0"
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            close = b"close" in value.lower()
    return status, length, chunked, close


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await _skip_trailers(reader)
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        await reader.readexactly(2)


async def _skip_trailers(reader: asyncio.StreamReader) -> None:
    while await reader.readuntil(b"\r\n") != b"\r\n":
        pass
