"""The broker's messages: the envelope of the GM and LM queues, worker heartbeats and an LM's "rebuilt" notice.

Task events travel on the events exchange as `TaskEvents` (`megha.common.wire.core`).
"""

from __future__ import annotations

from typing import Self

from pydantic import model_validator
from pydantic_core import to_json

from megha.common.core.messages import Completions, Delta, WorkerReport
from megha.common.wire.core import CompletionsModel, DeltaModel, WorkerReportModel
from megha.common.wire.fields import Count, Index, Name, Timestamp, WireModel
from megha.common.wire.mirror import CoreMirror


class WorkerHeartbeat(WireModel):
    """Worker -> LM, every MEGHA_HEARTBEAT_INTERVAL seconds: the agent is alive and runs `running` tasks."""

    worker_id: Name
    lm: Index
    at: Timestamp
    running: Count


class LMRebuilt(WireModel):
    """LM -> GM, from an LM rebuilt after a crash once its agents registered again and the reports that waited
    for it had time to arrive. The GM then asks it (`GET /v1/gms/{gm}/state`, holding its own lock, so no launch
    answer slips in between) which of its runs it holds or saw end: a run the GM believes is on that LM and that
    is neither was lost with its worker while no LM watched it (`megha.common.core.recovery.runs_lost`), and the
    GM runs it again."""

    lm: Index
    gm: Index
    incarnation: Count


class BrokerMessage(WireModel):
    """Envelope of every message on the GM and LM queues of the broker: exactly one field is set.

    A GM's queue carries `delta`, `completions` and `lm_rebuilt` from LMs; an LM's queue carries `worker_report`
    and `heartbeat` from workers, each signed by its agent in the message's headers (docs/topology.md).
    """

    delta: DeltaModel | None = None
    completions: CompletionsModel | None = None
    lm_rebuilt: LMRebuilt | None = None
    worker_report: WorkerReportModel | None = None
    heartbeat: WorkerHeartbeat | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        set_fields = [name for name in type(self).model_fields if getattr(self, name) is not None]
        if len(set_fields) != 1:
            raise ValueError(f"a broker message carries exactly one of {list(type(self).model_fields)}")
        return self

    @classmethod
    def described(cls, body: bytes) -> tuple[BrokerMessage | None, str]:
        """A body a consumer ignores, for its log line: the message, if it parses, and " (what it names)": its
        kind, and its sender, the GM it is for, its nodes or tasks ("" for an empty body)."""
        if not body:
            return None, ""
        try:
            msg = cls.model_validate_json(body)
        except ValueError:
            return None, f" ({len(body)} bytes that are no broker message)"
        if msg.heartbeat is not None:
            return msg, f" (a heartbeat of {msg.heartbeat.worker_id})"
        if msg.worker_report is not None:
            items = msg.worker_report.finished
            nodes = sorted({i.node for i in items})[:20]
            return msg, f" (a report of tasks {[i.task_id for i in items[:20]]} on nodes {nodes})"
        if msg.completions is not None:
            ended = [i.task_id for i in msg.completions.items[:20]]
            return msg, f" (completions of tasks {ended} for GM {msg.completions.gm})"
        if msg.delta is not None:
            return msg, f" (a delta of {len(msg.delta.nodes)} nodes for GM {msg.delta.gm})"
        assert msg.lm_rebuilt is not None
        return msg, f" (a notice of LM {msg.lm_rebuilt.lm} rebuilt, for GM {msg.lm_rebuilt.gm})"

    @classmethod
    def core_json(cls, msg: Delta | Completions | WorkerReport) -> bytes:
        """The JSON of the envelope carrying the core message `msg`, built as `CoreMirror.core_json` does."""
        field, model = _ENVELOPE_FIELDS[type(msg)]
        return to_json({field: model.plain(msg)})


_ENVELOPE_FIELDS: dict[type, tuple[str, type[CoreMirror]]] = {
    Delta: ("delta", DeltaModel),
    Completions: ("completions", CompletionsModel),
    WorkerReport: ("worker_report", WorkerReportModel),
}
