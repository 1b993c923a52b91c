"""An agent's node numbers kept across its own restarts (`megha.services.worker.node_claim`): what it claims
again, and what it does not trust."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from megha.common.models import WorkerRegistered
from megha.services.worker.node_claim import NodeClaim

LM = "http://lm-0:8100"


def given(first_node: int, nodes: int) -> WorkerRegistered:
    return WorkerRegistered(worker_id="w0", lm=0, first_node=first_node, nodes=nodes, incarnation=1)


def test_the_numbers_kept_are_claimed_again_for_the_same_lm_and_as_many_nodes(tmp_path: Path) -> None:
    folder = tmp_path / "megha-state"
    claim = NodeClaim(folder, "run-1", "w0")
    assert claim.read(LM, 2) is None  # a first start
    claim.keep(LM, given(4, 2))
    assert NodeClaim(folder, "run-1", "w0").read(LM, 2) == 4  # the next life of the agent
    claim.keep(LM, given(6, 2))  # given other numbers (the LM could not meet its claim): those are kept
    assert NodeClaim(folder, "run-1", "w0").read(LM, 2) == 6
    assert NodeClaim(folder, "run-1", "w0").read("http://lm-1:8100", 2) is None  # another LM
    assert NodeClaim(folder, "run-1", "w0").read(LM, 3) is None  # another number of nodes
    assert NodeClaim(folder, "run-2", "w0").read(LM, 2) is None  # another deployment
    assert NodeClaim(folder, "run-1", "w1").read(LM, 2) is None  # another agent
    assert os.stat(folder).st_mode & 0o777 == 0o700 and os.stat(claim.path).st_mode & 0o777 == 0o600
    assert sorted(p.name for p in folder.iterdir()) == ["run-1-w0.nodes"]  # nothing partial left


@pytest.mark.parametrize(
    "content", [b"", b"not json", b"[]", b'{"lm_url": "http://lm-0:8100", "first_node": -1, "nodes": 2}', b"{" * 5000]
)
def test_a_file_that_holds_no_numbers_is_not_trusted_and_said_once(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "megha-state"
    folder.mkdir(mode=0o700)
    (folder / "run-1-w0.nodes").write_bytes(content)
    claim = NodeClaim(folder, "run-1", "w0")
    with caplog.at_level(logging.WARNING, logger="megha.worker"):
        assert claim.read(LM, 2) is None
        assert claim.read(LM, 2) is None
    assert len(caplog.records) == 1 and "registers as a new agent" in caplog.text


def test_a_link_in_place_of_the_file_is_not_followed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "megha-state"
    folder.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text('{"lm_url": "http://lm-0:8100", "first_node": 0, "nodes": 2}')
    (folder / "run-1-w0.nodes").symlink_to(elsewhere)
    claim = NodeClaim(folder, "run-1", "w0")
    with caplog.at_level(logging.WARNING, logger="megha.worker"):
        assert claim.read(LM, 2) is None
    assert "may get other node numbers" in caplog.text


def test_a_folder_it_cannot_use_costs_the_claim_not_the_agent(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A folder another user may write to is not used: the agent registers as a new one, with one WARNING."""
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    (folder / "a-file").write_text("")  # a folder others may enter that holds files: not tightened
    claim = NodeClaim(folder, "run-1", "w0")
    with caplog.at_level(logging.WARNING, logger="megha.worker"):
        claim.keep(LM, given(0, 1))
        assert claim.read(LM, 1) is None
    assert len(caplog.records) == 1 and "may get other node numbers" in caplog.text
    assert not (folder / "run-1-w0.nodes").exists()
