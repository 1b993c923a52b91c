"""What every service's HTTP edge shares: explicit 4xx error bodies, a body-size limit, JSON logging set-up."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from megha.common.models import MAX_BODY_BYTES, ROOT_FIELD, ErrorBody, FieldError, validation_error_body


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
    """One request-validation error; malformed JSON is about the body as a whole (its loc is a character
    position, not a field)."""
    if e["type"] == "json_invalid":
        return FieldError(
            field=ROOT_FIELD, message=f"malformed JSON at character {e['loc'][-1]}: {e.get('ctx', {}).get('error', '')}"
        )
    return FieldError(field=".".join(str(p) for p in e["loc"][1:]) or ROOT_FIELD, message=e["msg"])


def install_error_handlers(app: FastAPI) -> None:
    """Validation failures become 422 bodies naming each field; nothing leaks out as a 500."""

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [_field_error(e) for e in exc.errors()]
        return JSONResponse(ErrorBody(error="invalid request body", detail=detail).model_dump(), status_code=422)

    @app.exception_handler(ValidationError)
    async def _model_invalid(request: Request, exc: ValidationError) -> JSONResponse:
        return JSONResponse(validation_error_body(exc).model_dump(), status_code=422)

    app.add_middleware(BodyLimit)


def configure_logging(level: str, name: str) -> logging.Logger:
    logging.basicConfig(level=level.upper(), format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the decisions
    return logging.getLogger(name)
