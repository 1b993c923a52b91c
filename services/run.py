"""Run a service with uvicorn from its MEGHA_* settings (the commands the Dockerfile and launcher use)."""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

import uvicorn

from megha.common.lifecycle import stop_requested
from megha.common.settings import (
    GMSettings,
    LMSettings,
    ServiceSettings,
    WorkerSettings,
    load_settings,
    settings_help,
)

S = TypeVar("S", bound=ServiceSettings)


def _help_asked(model: type[ServiceSettings]) -> bool:
    """`python -m megha.services.gm --help` (and so on) lists the settings instead of starting."""
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(settings_help(model))
        return True
    return False


class _Server(uvicorn.Server):
    """uvicorn's server, whose signal handler also ends the waits of a service still starting."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        stop_requested.set()
        super().handle_exit(sig, frame)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if sockets is not None and self.started:  # uvicorn says where it listens only for the sockets it binds
            self._log_started_message(sockets)


def _load(model: type[S], command: str) -> S:
    """The service's settings; its log lines take their format from them before its app is created."""
    from megha.services.client import use_tls_ca
    from megha.services.logs import use_log_format

    settings = load_settings(model, command)
    use_log_format(settings.log_format)
    use_tls_ca(settings.tls_ca)
    return settings


def _serve(create_app: Callable[[S], object], settings: S, command: str) -> None:
    """Serve `app`. uvicorn gets no logging configuration of its own (`log_config=None`): its loggers' lines go to
    the handler `configure_logging` put on the root logger, in the service's format. Its access log (a line per
    request, on the path of every launch) is on at log level debug only. With MEGHA_TLS_CERT and MEGHA_TLS_KEY it
    serves HTTPS only. Its socket is bound before the app is made (`_listening`)."""
    sock = _listening(settings, command)
    app = create_app(settings)
    if settings.holds_root():  # said once its app configured the log format
        logging.getLogger("megha").warning(
            "this service holds the deployment's root secret (MEGHA_CLUSTER_SECRET without MEGHA_CREDENTIAL): "
            "whoever reads it can sign as any GM, LM or agent; give each service only its own credential (`megha "
            "credential ROLE ID`, docs/security.md)"
        )
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,
        access_log=settings.log_level == "debug",
        ssl_certfile=settings.tls_cert or None,
        ssl_keyfile=settings.tls_key or None,
    )
    _Server(config).run(sockets=[sock])


def _listening(settings: ServiceSettings, command: str) -> socket.socket:
    """A socket bound to MEGHA_HOST and MEGHA_PORT for uvicorn, bound before the service starts (uvicorn binds
    only after its start-up, a GM's discovery of its LMs included); one line and exit status 2 when it cannot be
    (the port taken, a host name that does not resolve or is not this machine's)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            settings.host, settings.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
            sock.bind(address)
        except OSError:
            sock.close()
            raise
    except OSError as exc:
        print(
            f"{command}: bad settings: MEGHA_HOST={settings.host}, MEGHA_PORT={settings.port}: cannot listen there: "
            f"{exc.strerror or exc}",
            file=sys.stderr,
        )
        sys.exit(2)
    return sock


def serve_gm(command: str = "python -m megha.services.gm") -> None:
    """Run one GM service; `command` names it in a settings error."""
    if _help_asked(GMSettings):
        return
    from megha.services.gm.app import create_app

    settings = _load(GMSettings, command)
    _serve(create_app, settings, command)


def serve_lm(command: str = "python -m megha.services.lm") -> None:
    """Run one LM service; `command` names it in a settings error."""
    if _help_asked(LMSettings):
        return
    from megha.services.lm.app import create_app

    settings = _load(LMSettings, command)
    _serve(create_app, settings, command)


def serve_worker(command: str = "python -m megha.services.worker") -> None:
    """Run one worker agent service; `command` names it in a settings error."""
    if _help_asked(WorkerSettings):
        return
    from megha.services.worker.app import create_app

    settings = _load(WorkerSettings, command)
    _serve(create_app, settings, command)
