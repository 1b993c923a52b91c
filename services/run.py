"""Run a service with uvicorn from its MEGHA_* settings (the commands the Dockerfile and launcher use)."""

from __future__ import annotations

import sys

import uvicorn

from megha.common.settings import GMSettings, LMSettings, ServiceSettings, WorkerSettings, settings_help


def _help_asked(model: type[ServiceSettings]) -> bool:
    """`python -m megha.services.gm --help` (and so on) lists the settings instead of starting."""
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(settings_help(model))
        return True
    return False


def _serve(app: object, settings: ServiceSettings) -> None:
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level, access_log=False)  # type: ignore[arg-type]


def serve_gm() -> None:
    if _help_asked(GMSettings):
        return
    from megha.services.gm.app import create_app

    settings = GMSettings()
    _serve(create_app(settings), settings)


def serve_lm() -> None:
    if _help_asked(LMSettings):
        return
    from megha.services.lm.app import create_app

    settings = LMSettings()
    _serve(create_app(settings), settings)


def serve_worker() -> None:
    if _help_asked(WorkerSettings):
        return
    from megha.services.worker.app import create_app

    settings = WorkerSettings()
    _serve(create_app(settings), settings)
