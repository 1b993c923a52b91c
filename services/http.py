"""What every service's HTTP edge shares: JSON bodies parsed and answered fast, explicit 4xx error bodies, a
body-size limit, the client for calls between services, the garbage collector's settings, logging set-up (text or
JSON lines, uvicorn's included).

Routes read their body with `read_body(request, Model)` rather than a FastAPI body parameter, and answer with
`json_response`. FastAPI would decode the JSON into dicts, validate those in Python mode, and re-validate and
encode the response model; pydantic's own JSON parser and serialiser do the same work in about half the time
(0.28 instead of 0.49 ms for a 50-placement launch batch), which matters on every hop of a launch. A route
documents the body it reads with `openapi_extra=json_body(Model)` and `document_bodies(app, ...)`, and the errors
it answers besides those of every route (422, 413) with `responses=errors(...)`.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import ssl
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple, TypeVar
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from megha.common.models import MAX_BODY_BYTES, ROOT_FIELD, ErrorBody, FieldError, validation_error_body
from megha.common.transport.inmemory import fewer_gc_pauses

M = TypeVar("M", bound=BaseModel)

SCHEMAS = "#/components/schemas/{model}"


async def read_body(request: Request, model: type[M]) -> M:
    """The request's JSON body validated as `model`; a `ValidationError` (malformed JSON included, about the
    body as a whole) becomes a 422 naming each field through `install_error_handlers`."""
    return model.model_validate_json(await request.body())


def json_response(body: BaseModel | bytes, status: int = 200) -> Response:
    """A JSON response of a model, or of JSON bytes already made (say, by `CoreMirror.core_json`)."""
    content = body if isinstance(body, bytes) else body.model_dump_json()
    return Response(content, status_code=status, media_type="application/json")


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """The `openapi_extra` of a route that reads its body with `read_body(request, model)`."""
    schema = {"$ref": SCHEMAS.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


ERRORS = {
    404: "Unknown id",
    409: "Conflict with the current state",
    413: f"Body larger than {MAX_BODY_BYTES} bytes",
    422: "Invalid input, each offending field named",
    429: "Too many requests: try again later (Retry-After)",
    502: "A service this one relays to could not be reached, or answered badly",
    503: "Not ready, or changing hands: try again",
}
"""The error statuses a route may answer, each with an `ErrorBody`; a 500 is a bug, never documented."""


_FASTAPI_DESCRIPTIONS = ("Additional Response", "Validation Error")
"""What FastAPI writes for a response nobody described."""


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of a route that answers these error statuses besides 422 and 413 (which `document_bodies`
    documents for every route that takes input)."""
    return {status: {"model": ErrorBody, "description": ERRORS[status]} for status in statuses}


def document_bodies(app: FastAPI, *models: type[BaseModel]) -> None:
    """Add the schemas of the bodies routes declare with `json_body` to the app's OpenAPI components, and document
    every error response with `ErrorBody` (`document_errors`)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = build()
            _, defs = models_json_schema([(m, "validation") for m in (*models, ErrorBody)], ref_template=SCHEMAS)
            doc.setdefault("components", {}).setdefault("schemas", {}).update(defs["$defs"])
            document_errors(doc)
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]


def document_errors(doc: dict[str, Any]) -> None:
    """Every operation of an OpenAPI document lists the errors it may answer, each with an `ErrorBody`: those its
    route declares (`errors(...)`), 422 for any that takes parameters or a body (FastAPI's own 422 schema replaced:
    `install_error_handlers` answers an `ErrorBody`), 413 for any POST, PUT or PATCH (`BodyLimit` looks at every
    one, body or not)."""
    content = {"application/json": {"schema": {"$ref": SCHEMAS.format(model=ErrorBody.__name__)}}}
    for operations in doc.get("paths", {}).values():
        for method, op in operations.items():
            responses = op.setdefault("responses", {})
            statuses = {int(s) for s in responses if s.isdigit() and int(s) >= 400}
            if op.get("parameters") or "requestBody" in op:
                statuses.add(422)
            if method in ("post", "put", "patch"):
                statuses.add(413)
            for status in sorted(statuses):
                described = responses.get(str(status), {}).get("description")
                if described in (None, *_FASTAPI_DESCRIPTIONS):
                    described = ERRORS[status]
                responses[str(status)] = {"description": described, "content": content}
    schemas = doc.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):  # FastAPI's 422 body, no longer referenced
        if SCHEMAS.format(model=unused) not in json.dumps(doc):
            schemas.pop(unused, None)


def error(status: int, message: str, field: str = ROOT_FIELD) -> JSONResponse:
    """An explicit error response naming the offending field."""
    body = ErrorBody(error=message, detail=[FieldError(field=field, message=message)])
    return JSONResponse(body.model_dump(), status_code=status)


class BodyLimit:
    """413 for bodies over MAX_BODY_BYTES, before they are parsed; a chunked body is read only up to the limit.

    A pure ASGI middleware: Starlette's BaseHTTPMiddleware costs about a millisecond a request, which is most of
    a launch call's budget."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        too_big = error(413, f"body larger than {MAX_BODY_BYTES} bytes")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if not length.isdigit() or int(length) > MAX_BODY_BYTES:
                await too_big(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                await too_big(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _field_error(e: Mapping[str, Any]) -> FieldError:
    """One error of a path or query parameter; its loc starts with where the parameter came from."""
    return FieldError(field=".".join(str(p) for p in e["loc"][1:]) or ROOT_FIELD, message=e["msg"])


def install_error_handlers(app: FastAPI) -> None:
    """Validation failures become 422 bodies naming each field; nothing leaks out as a 500. Bodies fail as a
    pydantic `ValidationError` (`read_body`); FastAPI's `RequestValidationError` covers path and query
    parameters."""

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [_field_error(e) for e in exc.errors()]
        return JSONResponse(ErrorBody(error="invalid request parameters", detail=detail).model_dump(), status_code=422)

    @app.exception_handler(ValidationError)
    async def _model_invalid(request: Request, exc: ValidationError) -> JSONResponse:
        return JSONResponse(validation_error_body(exc).model_dump(), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """Starlette's own errors (an unknown path, a method a route does not take) as `ErrorBody`s too."""
        answer = error(exc.status_code, str(exc.detail))
        answer.headers.update(exc.headers or {})  # a 405's Allow
        return answer

    app.add_middleware(BodyLimit)


class CallError(Exception):
    """A call to another service failed in transport: no connection, a reset or closed connection, a timeout, or
    an answer that is not HTTP/1.1. Whether the request reached the service is unknown."""


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

    A kept-alive connection the server closed while idle fails the next request before any answer: such a
    request is sent again once on a new connection, unless the caller says it must not be (`resend=False`, for a
    call that is not idempotent, such as a preemption: the server may have acted on it before closing)."""

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

    async def post(self, url: str, body: bytes, resend: bool = True) -> Reply:
        return await self.request("POST", url, body, resend)

    async def get(self, url: str) -> Reply:
        return await self.request("GET", url)

    async def request(self, method: str, url: str, body: bytes | None = None, resend: bool = True) -> Reply:
        """Call `url` (http or https); raises CallError for a transport failure, never for an HTTP status."""
        origin, target = self._split(url)
        host, port, tls, host_header = self._origins[origin]
        head = [f"{method} {target} HTTP/1.1\r\n".encode(), b"host: ", host_header, b"\r\n"]
        if self._authorization is not None:
            head.append(b"authorization: %s\r\n" % self._authorization().encode())
        if body is not None:
            head.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
        message = b"".join([*head, b"\r\n", body or b""])
        try:
            async with asyncio.timeout(self.timeout):
                conn = self._take(origin)
                if conn is not None:
                    try:
                        return await self._exchange(origin, conn, message)
                    except (ConnectionError, asyncio.IncompleteReadError):
                        if not resend:
                            raise
                        # closed by the server while idle: send again on a new connection
                conn = await asyncio.open_connection(host, port, ssl=self._tls_context() if tls else None)
                return await self._exchange(origin, conn, message)
        except TimeoutError:
            raise CallError(f"{method} {url}: no answer within {self.timeout} s") from None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
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


def spawn(tasks: set[asyncio.Task[Any]], coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Run `coro` in the background, held in `tasks` until it ends; an exception it raises is logged (a
    background step never fails silently)."""
    task = asyncio.get_running_loop().create_task(coro)
    tasks.add(task)
    task.add_done_callback(_forget_and_log(tasks))
    return task


def _forget_and_log(tasks: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logging.getLogger("megha").error("background step failed", exc_info=task.exception())

    return done


@contextmanager
def serving_gc() -> Iterator[None]:
    """The cyclic garbage collector's settings while a service serves (enter it once start-up is done).

    With the defaults, each service process spent about 5% of a run in collections, and a full collection
    stopped it for 60-80 ms in the middle of a 10-s benchmark run (measured with gc.callbacks). What start-up
    built (the app, the cluster, registrations) is frozen out of every later collection, and young objects are
    collected far less often: almost all of a request's objects are freed by reference counting."""
    gc.collect()
    gc.freeze()
    try:
        with fewer_gc_pauses():
            yield
    finally:
        gc.unfreeze()


LogFormat = Literal["text", "json"]

_log_format: LogFormat = "text"

_NOT_EXTRA = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName", "color_message"}
"""What a log record holds besides the fields given with `extra=` (uvicorn's `color_message` is its message again,
with terminal colours)."""


def _extra(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _NOT_EXTRA}


def ids(
    *,
    job: object = None,
    task: object = None,
    attempt: object = None,
    gm: object = None,
    lm: object = None,
    node: object = None,
    worker: object = None,
    user: object = None,
) -> dict[str, object]:
    """The `extra=` of a log line about a decision (a refusal, an inconsistency, a repartition, a preemption, a
    retry, a loss, a worker taken out of service): the ids it concerns under these key names only, each an id or
    a list of ids; those not given (None) are left out. docs/deploy.md ("Logs") lists the decisions and keys."""
    fields = {
        "job": job,
        "task": task,
        "attempt": attempt,
        "gm": gm,
        "lm": lm,
        "node": node,
        "worker": worker,
        "user": user,
    }
    return {k: v for k, v in fields.items() if v is not None}


class TextFormatter(logging.Formatter):
    """`<time> <service> <LEVEL> <logger>: <message>`, then each field given with `extra=` as ` key=value`."""

    def __init__(self, service: str) -> None:
        super().__init__(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        return super().formatMessage(record) + "".join(f" {k}={v}" for k, v in _extra(record).items())


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (ISO 8601, UTC), level, logger, service, message, each field given with
    `extra=` (ids of jobs, tasks, GMs, LMs, nodes), and exc_info / stack_info as formatted text when there are."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")[:-6] + "Z",
            "level": record.levelname,
            "logger": record.name,
            "service": self.service,
            "message": record.getMessage(),
        }
        for key, value in _extra(record).items():
            entry.setdefault(key, value)  # an extra field never hides one of the above
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc_info"] = record.exc_text
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


_FORMATTERS: dict[LogFormat, Callable[[str], logging.Formatter]] = {"text": TextFormatter, "json": JsonFormatter}


def use_log_format(log_format: LogFormat) -> None:
    """The format `configure_logging` gives this process's log lines when its caller names none: `run.py` sets
    MEGHA_LOG_FORMAT's before it creates a service's app, whose `create_app` names the service."""
    global _log_format
    _log_format = log_format


def configure_logging(level: str, name: str, log_format: LogFormat | None = None) -> logging.Logger:
    """Every log line of the process on stderr through one handler on the root logger, in `log_format` (None: the
    one `use_log_format` chose, text unless told) and naming the service `name`. uvicorn's loggers have no handler
    of their own (`run.py`), so its lines take the same way. As with `logging.basicConfig`, a root logger that
    already has a handler (an earlier call, a test's log capture) is left as it is."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(_FORMATTERS[log_format or _log_format](name))
        root.addHandler(handler)
        root.setLevel(level.upper())
        logging.captureWarnings(True)  # a Python warning is a log line too, not a line in another format
    # The broker client says what it waits for and when it is back; aio-pika's own reconnection attempts would
    # repeat that every second, aiormq's as errors.
    logging.getLogger("aio_pika").setLevel(logging.WARNING)
    logging.getLogger("aiormq").setLevel(logging.CRITICAL)
    return logging.getLogger(name)
