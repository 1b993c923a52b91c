"""Which broker messages a GM believes (docs/security.md, "Broker reports"): with MEGHA_AUTH=on only a delta,
completions or rebuilt notice that the LM it names signed for this GM counts; the rest is ignored, counted and
logged (a flood costs a line a minute per claimed LM)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from megha.common.auth import MessageVerifier, Unauthenticated
from megha.common.models import BrokerMessage
from megha.common.settings import GMSettings
from megha.common.transport.rabbit import IgnoredMessages, lm_report_signer
from megha.services.logs import ids

log = logging.getLogger("megha.gm")


class LMReportGate:
    """The signature check of the LMs' messages on a GM's queue, and the count of those it ignored."""

    def __init__(self, settings: GMSettings) -> None:
        self.gm = settings.gm_id  # the GM identity whose queue this is (a stand-in's: the GM it stands in for)
        # The LMs' certificates are checked against the deployment's root (None with MEGHA_AUTH=off: nothing is).
        root = settings.trusted_root() if settings.auth == "on" else None
        self.verifier = None if root is None else MessageVerifier(root, "lm")
        self.ignored = IgnoredMessages()  # messages ignored, and when to log them

    def admitted(self, body: bytes, headers: Mapping[str, object]) -> BrokerMessage | None:
        """The message to apply; None when it is ignored: with MEGHA_AUTH=on, one that is not signed for this GM
        by an LM, or is not that LM's own delta, completions or rebuilt notice. Signed messages are accepted
        whatever their age: a message may wait in the queue while this GM restarts, and a copy replayed to this GM
        is applied as the broker's own redelivery would be (deltas are versioned, completions name their run by
        attempt and run number; docs/security.md, "An LM's messages to the GMs"). A signed body that is no broker
        message raises the ValidationError that dead-letters it, as with MEGHA_AUTH=off."""
        msg, claimed, why = self._verdict(body, headers)
        if why:
            self.ignore(claimed, why, body)
            return None
        return msg

    def believed(self, body: bytes, headers: Mapping[str, object]) -> BrokerMessage | None:
        """What `admitted` would apply, without counting or logging what it would ignore (None for that, and for a
        body that is no broker message): for a look at the messages waiting for this GM, each of which is handled
        through `admitted` afterwards."""
        try:
            msg, _, why = self._verdict(body, headers)
        except ValueError:
            return None
        return None if why else msg

    def _verdict(self, body: bytes, headers: Mapping[str, object]) -> tuple[BrokerMessage | None, str, str]:
        """The message, the LM it says it comes from, and why it is not believed ("" when it is). Raises the
        ValidationError of a body that is no broker message (signed, or with MEGHA_AUTH=off)."""
        if self.verifier is None:
            return BrokerMessage.model_validate_json(body), "", ""
        try:
            signer = lm_report_signer(self.verifier, self.gm, body, headers)
        except Unauthenticated as exc:
            msg, _ = BrokerMessage.described(body)
            return None, lm_of(msg), str(exc)
        msg = BrokerMessage.model_validate_json(body)
        claimed = lm_of(msg)
        if claimed != signer:
            return None, claimed, f"it is signed by LM {signer}"
        return msg, claimed, ""

    def ignore(self, claimed: str, what: str, body: bytes) -> None:
        """Count a broker message this GM ignores and log it (`IgnoredMessages`: at most a line a minute per
        claimed LM). `claimed` is the LM the message says it comes from ("" when it names none)."""
        suffix = self.ignored.due(claimed)
        if suffix is None:
            return
        log.warning(
            "ignored a broker message from LM %s%s: %s%s",
            claimed or "(none named)",
            BrokerMessage.described(body)[1],
            what,
            suffix,
            extra=ids(gm=self.gm, lm=int(claimed) if claimed else None),
        )


def lm_of(msg: BrokerMessage | None) -> str:
    """The LM a message on a GM's queue says it comes from ("" when it is none of an LM's messages)."""
    if msg is None:
        return ""
    for about in (msg.delta, msg.completions, msg.lm_rebuilt):
        if about is not None:
            return str(about.lm)
    return ""
