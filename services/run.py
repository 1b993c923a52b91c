"""Run a service with uvicorn from its MEGHA_* settings (the commands the Dockerfile and launcher use)."""

from __future__ import annotations

import sys
from types import FrameType

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


def _serve(app: object, settings: ServiceSettings) -> None:
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
    )
    _Server(config).run()


def serve_gm() -> None:
    if _help_asked(GMSettings):
        return
    from megha.services.gm.app import create_app

    settings = load_settings(GMSettings, "python -m megha.services.gm")
    _serve(create_app(settings), settings)


def serve_lm() -> None:
    if _help_asked(LMSettings):
        return
    from megha.services.lm.app import create_app

    settings = load_settings(LMSettings, "python -m megha.services.lm")
    _serve(create_app(settings), settings)


def serve_worker() -> None:
    if _help_asked(WorkerSettings):
        return
    from megha.services.worker.app import create_app

    settings = load_settings(WorkerSettings, "python -m megha.services.worker")
    _serve(create_app(settings), settings)
