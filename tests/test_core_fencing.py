"""GM terms at an LM (`megha.common.core.fencing`): a newer holder of a GM identity fences the older one."""

from __future__ import annotations

import pytest

from megha.common.core.fencing import GMTerms, Superseded


def test_a_claim_fences_older_terms_and_never_shares_a_term() -> None:
    terms = GMTerms(num_gms=2)
    terms.check(0, 0)  # before any claim, a GM that never claimed is served
    terms.claim(0, 1)
    terms.check(0, 1)
    terms.claim(0, 2)  # a peer stands in for GM 0
    with pytest.raises(Superseded, match="GM 0's term 1 was superseded by term 2"):
        terms.check(0, 1)
    with pytest.raises(Superseded):
        terms.claim(0, 2)  # two claimants never share a term
    terms.check(1, 0)  # other GMs are not affected
    assert terms.terms == [2, 0]


def test_a_call_with_a_newer_term_than_seen_is_adopted() -> None:
    """An LM that restarted forgot its terms: it learns them again from the holders' calls."""
    terms = GMTerms(num_gms=1)
    terms.check(0, 3)
    with pytest.raises(Superseded):
        terms.check(0, 2)
    assert terms.terms == [3]
