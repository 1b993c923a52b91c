"""Authentication and authorisation at every service's HTTP edge (the credentials are `common/auth.py`'s).

Each app declares, for every route it serves, who may call it (`protect(app, verifier, rules)`):

- `OPEN`: anyone; `/healthz`, `/metrics`, `/docs` and the dashboard's page and assets (the page asks for a token
  before it reads any data);
- a set of roles: `USERS` (any user with an API token; a route then checks the job's user with
  `Principal.may_act_for`), `OPERATORS` (users named in MEGHA_OPERATORS), and the services' roles `gm`, `lm`,
  `worker` (tokens signed with the cluster secret).

A request without a valid credential gets 401 (and `WWW-Authenticate: Bearer`), one whose principal the route does
not allow 403, each with an `ErrorBody` naming the field `authorization`. A route nobody declared fails the app's
creation, so a new route cannot be left open by mistake. With MEGHA_AUTH=off nothing is checked: every request is
an anonymous operator's, and the service says so loudly when it starts.

A pure ASGI middleware, as `BodyLimit`: a launch's budget is a fraction of a millisecond, and a token already
verified costs a dict lookup.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from megha.common.auth import Principal, Unauthenticated, Verifier
from megha.services.http import error

log = logging.getLogger("megha.auth")

OPEN: frozenset[str] = frozenset()
"""Who may call a route that needs no credential."""
USERS = frozenset({"user"})
OPERATORS = frozenset({"operator"})
GM = frozenset({"gm"})
LM = frozenset({"lm"})
WORKER = frozenset({"worker"})

AUTH_FIELD = "authorization"
ANONYMOUS = Principal("user", "anonymous", operator=True)
"""Who every request is with MEGHA_AUTH=off."""
NOBODY = Principal("user", "anonymous")
"""Who calls an open route (or an unknown one) with authentication on."""

Rules = Mapping[str, frozenset[str]]
"""Who may call each route, keyed "METHOD /path/{template}" as the route is declared."""


def principal(request: Request) -> Principal:
    """Who made `request` (set by `Authenticate`)."""
    return request.scope["state"]["principal"]  # type: ignore[no-any-return]


def acts_as(who: Principal, role: str, ident: str) -> bool:
    """Whether `who` is service (`role`, `ident`) (anyone is, with MEGHA_AUTH=off)."""
    return who is ANONYMOUS or (who.role == role and who.name == ident)


def acts_as_gm(who: Principal, gm: int, num_gms: int, stand_in: bool = True) -> bool:
    """Whether `who` may call as GM `gm`: GM `gm` itself or, with `stand_in`, the next GM of the ring, which stands
    in for it while it is down (docs/reliability.md; the LM's terms then fence the older holder). Anyone with
    MEGHA_AUTH=off."""
    return acts_as(who, "gm", str(gm)) or (stand_in and num_gms > 1 and acts_as(who, "gm", str((gm + 1) % num_gms)))


def allowed(who: Principal, roles: frozenset[str]) -> bool:
    if not roles:
        return True
    if who.operator and "operator" in roles:
        return True
    return who.role in roles


class Authenticate:
    """Sets the request's principal from its `Authorization` header and answers 401 or 403 for a route it may not
    call (see the module's docstring)."""

    def __init__(self, app: ASGIApp, verifier: Verifier | None, routes: list[tuple[BaseRoute, str]], rules: Rules):
        self.app = app
        self.verifier = verifier
        self.routes = routes
        self.rules = rules

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        roles = self._roles(scope)
        if self.verifier is None or roles is None or not roles:
            scope.setdefault("state", {})["principal"] = ANONYMOUS if self.verifier is None else NOBODY
            await self.app(scope, receive, send)
            return
        header = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                header = value.decode("latin-1")
                break
        try:
            who = self.verifier.principal(header, time.time())
        except Unauthenticated as exc:
            log.warning("refused %s %s (401): %s", scope["method"], scope["path"], exc, extra=_client(scope))
            refused = error(401, str(exc), AUTH_FIELD)
            refused.headers["WWW-Authenticate"] = "Bearer"
            await refused(scope, receive, send)
            return
        if not allowed(who, roles):
            message = f"{who} may not {scope['method']} {scope['path']} (allowed: {', '.join(sorted(roles))})"
            log.warning("refused %s (403)", message, extra=_client(scope))
            await error(403, message, AUTH_FIELD)(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = who
        await self.app(scope, receive, send)

    def _roles(self, scope: Scope) -> frozenset[str] | None:
        """Who may call the route `scope` asks for; None when no route matches (the app answers 404 or 405)."""
        for route, key in self.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return self.rules[key]
        return None


def _client(scope: Scope) -> dict[str, object]:
    client = scope.get("client")
    return {"client": f"{client[0]}:{client[1]}"} if client else {}


def _keys(route: BaseRoute) -> Iterable[str]:
    path = getattr(route, "path", "")
    for method in sorted(getattr(route, "methods", None) or {"GET"}):
        if method != "HEAD":
            yield f"{method} {path}"


def routes_of(app: FastAPI) -> set[str]:
    """Every "METHOD /path" `app` serves, as `Rules` name them."""
    return {key for route in app.routes for key in _keys(route)}


def protect(app: FastAPI, verifier: Verifier | None, rules: Rules, service: str) -> None:
    """Guard `app`'s routes by `rules` (call it once every route is declared). Raises ValueError naming a route
    `rules` does not cover. (A rule for a route the app lacks is harmless; `routes_of` lets a test compare.)"""
    routes: list[tuple[BaseRoute, str]] = []
    for route in app.routes:
        for key in _keys(route):
            if key not in rules:
                raise ValueError(f"{service}: route {key} has no authorisation rule")
            routes.append((route, key))
    app.add_middleware(Authenticate, verifier=verifier, routes=routes, rules=rules)
    _document(app, rules)
    if verifier is None:
        logging.getLogger("megha").warning(
            "AUTHENTICATION IS OFF (MEGHA_AUTH=off): anyone who reaches %s can call every route: submit, launch, "
            "preempt, cancel. For a development run only (docs/security.md)",
            service,
        )


def _document(app: FastAPI, rules: Rules) -> None:
    """The OpenAPI document names the bearer scheme, and 401 and 403 on every route that needs a credential."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        first = app.openapi_schema is None
        doc = build()
        if first:
            doc.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
                "type": "http",
                "scheme": "bearer",
                "description": "a user's API token (MEGHA_API_TOKENS), or a service's token signed with the "
                "cluster secret; not checked with MEGHA_AUTH=off",
            }
            body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
            for path, operations in doc.get("paths", {}).items():
                for method, op in operations.items():
                    if not rules.get(f"{method.upper()} {path}"):
                        continue
                    op["security"] = [{"bearer": []}]
                    responses = op.setdefault("responses", {})
                    responses["401"] = {"description": "No valid credential (Authorization: Bearer)", "content": body}
                    responses["403"] = {"description": "The credential's user or service may not", "content": body}
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


_EVERY_SERVICE: dict[str, frozenset[str]] = {
    "GET /healthz": OPEN,
    "GET /metrics": OPEN,
    "GET /openapi.json": OPEN,
    "GET /docs": OPEN,
    "GET /docs/assets/{name}": OPEN,
    "GET /docs/oauth2-redirect": OPEN,
}

GM_RULES: Rules = {
    **_EVERY_SERVICE,
    "POST /v1/jobs": USERS,  # a user submits for itself (route checks), an operator for anyone
    "GET /v1/jobs": USERS,  # a user lists its own jobs
    "GET /v1/jobs/{job_id}": USERS,
    "DELETE /v1/jobs/{job_id}": USERS,
    "GET /v1/jobs/{job_id}/tasks/{task_id}/logs": USERS,
    "GET /v1/jobs/{job_id}/events": USERS,  # a user its own jobs' (the route checks, as GET /v1/jobs/{job_id})
    "GET /v1/queues": USERS,
    "GET /v1/state": OPERATORS | GM,
    "GET /v1/overview": OPERATORS,
    "GET /dashboard": OPEN,  # the page and its assets hold no data; the page asks for a token
    "GET /dashboard/{name}": OPEN,
    "POST /v1/peers/{gm}/journal": GM,  # the previous GM's journal copy
    "POST /v1/peers/{gm}/release": GM,
    "GET /v1/peers/jobs/{job_id}": GM,  # a peer's jobs may depend on this job (the peer checks its user's right)
}

LM_RULES: Rules = {
    **_EVERY_SERVICE,
    "POST /v1/workers": WORKER,  # an agent registers itself only (route checks its id)
    "GET /v1/cluster": GM | OPERATORS,
    "POST /v1/launch": GM,
    "POST /v1/preempt": GM,
    "POST /v1/stop": GM,
    "POST /v1/gangs/prepare": GM,
    "POST /v1/gangs/commit": GM,
    "POST /v1/gangs/abort": GM,
    "GET /v1/gms/{gm}/state": GM | OPERATORS,  # a GM its own (route checks); operators any (megha chaos's views)
    "POST /v1/gms/{gm}/claim": GM,
    "GET /v1/state": GM | OPERATORS,
    "GET /v1/nodes/{node}/tasks/{task_id}/logs": GM | OPERATORS,
}

WORKER_RULES: Rules = {
    **_EVERY_SERVICE,
    "POST /v1/tasks": LM,
    "POST /v1/preempt": LM,
    "GET /v1/state": LM | OPERATORS,
    "GET /v1/tasks/{task_id}/logs": LM | OPERATORS,
}
