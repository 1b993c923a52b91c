"""Which broker reports an LM believes (docs/security.md, "Broker reports"): with MEGHA_AUTH=on only what an agent
signed with its own key counts, and only about the nodes it holds; the rest is ignored, counted and logged (a flood
costs a line a minute per claimed sender)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from megha.common.models import BrokerMessage, WorkerReportModel
from megha.common.settings import LMSettings
from megha.common.transport.rabbit import IgnoredMessages, report_key, report_sender, report_signed_by
from megha.services.lm.membership import Membership
from megha.services.logs import ids

log = logging.getLogger("megha.lm")


class ReportGate:
    """The signature and node checks of an LM's broker reports, and the count of those it ignored."""

    def __init__(self, settings: LMSettings, members: Membership) -> None:
        self.settings = settings
        self.members = members
        # The secret each agent's signing key is derived from (None with MEGHA_AUTH=off: nothing is checked), and
        # the keys of registered agents.
        self.secret = settings.report_secret() if settings.auth == "on" else None
        self.keys: dict[str, bytes] = {}
        self.ignored = IgnoredMessages()  # messages (or parts of them) ignored, and when to log them

    def key_for(self, worker_id: str) -> bytes | None:
        """The signing key of a newly registered agent (None with MEGHA_AUTH=off), kept for its reports."""
        if self.secret is None:
            return None
        self.keys[worker_id] = report_key(self.secret, worker_id)
        return self.keys[worker_id]

    def _key_of(self, worker_id: str) -> bytes:
        """The key agent `worker_id` signs its reports with (derived afresh for an agent not registered here)."""
        key = self.keys.get(worker_id)
        if key is None:
            assert self.secret is not None
            key = report_key(self.secret, worker_id)
        return key

    def signer(self, body: bytes, headers: Mapping[str, object]) -> str | None:
        """The agent that signed this broker message for this LM; None (and the message ignored) when it is
        unsigned or its signature is not that agent's. An agent not (yet) registered here may sign too: its
        reports wait until the cluster is complete, and then count only for nodes it holds."""
        claimed = report_sender(headers)
        if claimed is None:
            self.ignore("", "it is not signed", body)
            return None
        if not report_signed_by(self._key_of(claimed), self.settings.lm_id, claimed, body, headers):
            self.ignore(claimed, "its signature is not that agent's for this LM", body)
            return None
        return claimed

    def of_own_nodes(self, sender: str, report: WorkerReportModel) -> WorkerReportModel | None:
        """The items of `sender`'s report about nodes it registered (None if there is none); the others are
        ignored: an agent reports only the runs on its own nodes."""
        nodes = self.members.agent_nodes[sender][1] if sender in self.members.agent_nodes else range(0)
        foreign = [item for item in report.finished if item.node not in nodes]
        if not foreign:
            return report
        self.ignore(
            sender,
            f"it reports runs on nodes {sorted({item.node for item in foreign})[:20]}, which that agent does not "
            f"hold (tasks {[item.task_id for item in foreign[:20]]})",
        )
        own = [item for item in report.finished if item.node in nodes]
        return report.model_copy(update={"finished": own}) if own else None

    def ignore(self, claimed: str, what: str, body: bytes = b"") -> None:
        """Count a broker message (or part of one) this LM ignores, and log it: at once for a sender not logged in
        the last IGNORED_LOG_EVERY seconds, else with the next line about it (a flood is not a flood of lines).
        `claimed` is the agent the message says it comes from ("" when it names none)."""
        suffix = self.ignored.due(claimed)
        if suffix is None:
            return
        log.warning(
            "ignored a broker message from worker agent %s%s: %s%s",
            repr(claimed[:128]) if claimed else "(none named)",
            BrokerMessage.described(body)[1],
            what,
            suffix,
            extra=ids(lm=self.settings.lm_id, worker=claimed[:128] or None),
        )
