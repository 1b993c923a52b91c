"""Run a service with uvicorn from its MEGHA_* settings (the commands the Dockerfile and launcher use)."""

from __future__ import annotations

import uvicorn

from megha.common.settings import GMSettings, LMSettings, ServiceSettings, WorkerSettings


def _serve(app: object, settings: ServiceSettings) -> None:
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level, access_log=False)  # type: ignore[arg-type]


def serve_gm() -> None:
    from megha.services.gm.app import create_app

    settings = GMSettings()
    _serve(create_app(settings), settings)


def serve_lm() -> None:
    from megha.services.lm.app import create_app

    settings = LMSettings()
    _serve(create_app(settings), settings)


def serve_worker() -> None:
    from megha.services.worker.app import create_app

    settings = WorkerSettings()
    _serve(create_app(settings), settings)
