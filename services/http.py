"""The HTTP edge every service shares: JSON bodies parsed and answered fast, explicit 4xx error bodies, a body-size
limit, and the OpenAPI documentation of bodies and errors.

Routes read their body with `read_body(request, Model)` rather than a FastAPI body parameter, and answer with
`json_response`. FastAPI would decode the JSON into dicts, validate those in Python mode, and re-validate and
encode the response model; pydantic's own JSON parser and serialiser do the same work in about half the time
(0.28 instead of 0.49 ms for a 50-placement launch batch), which matters on every hop of a launch. A route
documents the body it reads with `openapi_extra=json_body(Model)` and `document_bodies(app, ...)`, and the errors
it answers besides those of every route (422, 413) with `responses=errors(...)`.

The other parts of a service's edge have modules of their own: `client` (calls between services), `retry` (the
policy of each such call), `logs` (log lines), `background` (background steps, the garbage collector's settings).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from pydantic_core import InitErrorDetails, PydanticCustomError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from megha.common.jsonkeys import key_twice
from megha.common.models import (
    MAX_BODY_BYTES,
    MAX_FIELD_ERRORS,
    ROOT_FIELD,
    ErrorBody,
    FieldError,
    validation_error_body,
)

M = TypeVar("M", bound=BaseModel)

SCHEMAS = "#/components/schemas/{model}"


async def read_body(request: Request, model: type[M], *, keys_once: bool = False) -> M:
    """The request's JSON body validated as `model`; a `ValidationError` (malformed JSON included, about the
    body as a whole) becomes a 422 naming each field through `install_error_handlers`.

    `keys_once`, for the routes users call: a body with an object that gives a key twice is refused too, a 422
    naming that key's path, since readers disagree on which value counts (pydantic's, the last; a proxy's or an
    audit log's, perhaps the first). That check parses a valid body a second time; peers' routes, the launch
    batches' above all, do not pay for it."""
    body = await request.body()
    valid = model.model_validate_json(body)
    if keys_once and (path := key_twice(body)) is not None:
        twice = PydanticCustomError("key_twice", "key given twice in one object (readers disagree on which counts)")
        raise ValidationError.from_exception_data(model.__name__, [InitErrorDetails(type=twice, loc=path, input=body)])
    return valid


async def caller_left(request: Request) -> bool:
    """True when the caller closed the connection before this route got to act on its request: a GM that gave up
    on a call (MEGHA_LM_TIMEOUT) has closed it, so an LM that was paused or overloaded meanwhile must not apply a
    launch or preemption its GM already counted as failed (docs/reliability.md, "An LM that stalls").

    The server reads a close that came after the request's bytes one event-loop turn after the request itself, so
    the route first yields that turn; `Request.is_disconnected` then reads what the server saw without waiting.
    Under an ASGI test transport, which never closes early, this is always False."""
    await asyncio.sleep(0)
    return await request.is_disconnected()


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


JOURNAL_COPY_BYTES = 8 * MAX_BODY_BYTES
"""The body limit of a GM's journal copy to its peer (`POST /v1/peers/{gm}/journal`): one journal line holds a
whole job (its body up to MAX_BODY_BYTES, and the job's ids), and a batch carries its lines as JSON strings, which
may double them (every quote escaped); `Replicator` sends batches of at most MAX_BODY_BYTES of lines. Only a GM's
credential reaches the route (the authentication middleware runs before this one reads a body)."""

_JOURNAL_COPY = re.compile(r"/v1/peers/[0-9]+/journal")


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
        limit = JOURNAL_COPY_BYTES if _JOURNAL_COPY.fullmatch(scope["path"]) else MAX_BODY_BYTES
        too_big = error(413, f"body larger than {limit} bytes")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if not length.isdigit() or int(length) > limit:
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
            if size > limit:
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
        detail = [_field_error(e) for e in exc.errors()[:MAX_FIELD_ERRORS]]
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
