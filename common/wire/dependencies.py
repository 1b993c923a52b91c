"""Between GMs, for job dependencies: what a GM answers a peer that asks about a job its own jobs depend on
(`GET /v1/peers/jobs/{job_id}`, docs/dependencies.md)."""

from __future__ import annotations

from megha.common.wire.fields import Index, Name, User, WireModel
from megha.common.wire.jobs import JobState


class ParentJob(WireModel):
    """A job another GM's jobs may depend on: its id, its user (the asking GM shows it only to a caller who may
    see that user's jobs) and its state."""

    job_id: Name
    user: User
    gm: Index
    state: JobState
