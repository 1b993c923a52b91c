"""What the tests of the deployment files (compose, swarm) share: the module each service runs and the settings
model it reads, and each model's role."""

from __future__ import annotations

from megha.common.settings import GMSettings, LMSettings, LoadgenSettings, ServiceSettings, WorkerSettings

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
