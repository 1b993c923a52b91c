"""The one assembly of a service's FastAPI app, shared by the GM, the LM and the worker agent: error handlers and
the body limit, a 503 for a service not ready yet, GET /metrics, GET /healthz, the documentation of request bodies
and errors, the API docs served offline, and the authorisation of every route.

A service's `create_app` makes its app with `service_app`, declares its own routes on it, and hands it to `sealed`
once they are all declared (the authorisation rules must cover every route, and bodies are documented per route):

    app = service_app("Megha LM 0", lifespan, lm_registry(service), health, NotReady, "LM 0")
    @app.post("/v1/launch", ...)
    async def launch(request: Request) -> Response: ...
    return sealed(app, settings.verifier(), LM_RULES, "LM 0", LaunchBatchModel, ...)
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from megha.common.auth import Verifier
from megha.common.models import Health
from megha.services.apidocs import serve_docs_offline
from megha.services.auth import Rules, protect
from megha.services.http import document_bodies, error, install_error_handlers
from megha.services.metrics import mount_metrics

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


def service_app(
    title: str,
    lifespan: Lifespan,
    registry: CollectorRegistry,
    health: Callable[[], Health],
    not_ready: type[Exception] | None = None,
    name: str = "",
) -> FastAPI:
    """A service's app before its own routes: 4xx error bodies and the body limit, GET /metrics of `registry`,
    and GET /healthz answering `health()` (a `Health` model: its class is the route's response model). A
    `not_ready` raised by a route is
    answered 503 "<name> not ready: <why>" (a client tries again)."""
    app = FastAPI(title=title, lifespan=lifespan)
    install_error_handlers(app)
    mount_metrics(app, registry)
    if not_ready is not None:

        @app.exception_handler(not_ready)
        async def _not_ready(request: Request, exc: Exception) -> JSONResponse:
            return error(503, f"{name} not ready: {exc}")

    @app.get("/healthz", response_model=typing.get_type_hints(health)["return"])
    async def healthz() -> Health:
        return health()

    return app


def sealed(app: FastAPI, verifier: Verifier | None, rules: Rules, name: str, *bodies: type[BaseModel]) -> FastAPI:
    """`app` once its routes are declared: the `bodies` its routes read documented with every error answer, the
    API docs served without a CDN, and every route guarded by `rules` for `verifier` (None: MEGHA_AUTH=off)."""
    document_bodies(app, *bodies)
    serve_docs_offline(app)
    protect(app, verifier, rules, name)
    return app
