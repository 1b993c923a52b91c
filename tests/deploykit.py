"""What the tests of the deployment files (compose, swarm) share: the module each service runs and the settings
model it reads, each model's role, a service's settings as its container builds them, and what its secrets give it."""

from __future__ import annotations

import os
import shlex
from typing import Any
from urllib.parse import urlsplit

import pytest

from megha.common.settings import GMSettings, LMSettings, LoadgenSettings, ServiceSettings, WorkerSettings
from megha.common.transport.rabbit import broker_user

MODELS: dict[str, type[ServiceSettings]] = {
    "megha.services.gm": GMSettings,
    "megha.services.lm": LMSettings,
    "megha.services.worker": WorkerSettings,
    "megha.loadgen.services": LoadgenSettings,
}
"""The module each service runs (`python -m <module>`) -> the settings model it reads."""

ROLE_OF: dict[type[ServiceSettings], str] = {
    GMSettings: "gm",
    LMSettings: "lm",
    WorkerSettings: "worker",
    LoadgenSettings: "loadgen",
}
"""A settings model -> the role that reads it (as in MEGHA_* file names, broker users, secrets)."""


def module_of(service: dict[str, Any]) -> str | None:
    """The module a compose or stack service runs (`python -m <module>`), None for another command."""
    command = service.get("command")
    argv = shlex.split(command) if isinstance(command, str) else list(command or [])
    return argv[2] if argv[:2] == ["python", "-m"] and len(argv) > 2 else None


def settings_in(model: type[ServiceSettings], env: dict[str, str]) -> ServiceSettings:
    """The model as the service builds it in a container whose environment is exactly `env`."""
    with pytest.MonkeyPatch.context() as mp:
        for key in list(os.environ):
            if key.upper().startswith("MEGHA_"):
                mp.delenv(key)
        for key, value in env.items():
            mp.setenv(key, value)
        return model()


def check_secrets(name: str, settings: ServiceSettings) -> None:
    """What its secrets give Megha service `name` in every deployment file: its role's broker user, authentication
    on and, but to the load generator, its own credential (issued for its role and id, not the root's) and the
    users' API tokens as digests only."""
    role = ROLE_OF[type(settings)]
    assert urlsplit(settings.amqp_url).username == broker_user(settings.run_id, role), f"{name}: another role's user"
    assert settings.auth == "on", f"{name}: MEGHA_AUTH"
    if role == "loadgen":
        return
    credential = settings.own_credential()
    assert (credential.role, credential.ident) == (role, settings.ident()) and not settings.holds_root(), name
    tokens = settings.api_tokens.get_secret_value()
    assert all(line.split("=", 1)[1].startswith("sha256:") for line in tokens.split()), f"{name}: a token"
