"""GM terms at an LM: which holder of a GM identity may place tasks, so that a GM a peer stood in for is fenced.

A GM identity (its id, its queue, its partitions) is held by one process at a time: the GM itself, or, while it
stays down, the peer that stands in for it (docs/reliability.md, "A GM that stays down"). Each holder claims the
identity at every LM with a term higher than any the LM has seen for it; the LM then refuses launches and
preemptions that carry a lower term. A GM that was only stalled or cut off, and comes back still believing it
holds its identity, is refused at its first call and rejoins; a stand-in whose GM returned is refused likewise.
"""

from __future__ import annotations


class Superseded(Exception):
    """A call carried a term lower than one the LM has seen for its GM: a newer holder took the identity over."""

    def __init__(self, gm: int, term: int, current: int) -> None:
        super().__init__(f"GM {gm}'s term {term} was superseded by term {current}: another holder took GM {gm} over")
        self.gm, self.term, self.current = gm, term, current


class GMTerms:
    """The highest term an LM has seen for each GM identity."""

    def __init__(self, num_gms: int) -> None:
        self.terms = [0] * num_gms

    def claim(self, gm: int, term: int) -> None:
        """Take GM `gm` over with `term`, which must exceed every term seen for it (two claimants never share
        one); raises Superseded otherwise."""
        if term <= self.terms[gm]:
            raise Superseded(gm, term, self.terms[gm])
        self.terms[gm] = term

    def check(self, gm: int, term: int) -> None:
        """Admit a call of GM `gm` carrying `term` (a higher term than seen is adopted), or raise Superseded."""
        if term < self.terms[gm]:
            raise Superseded(gm, term, self.terms[gm])
        self.terms[gm] = term
