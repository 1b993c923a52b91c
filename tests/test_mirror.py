"""Wire models derived from core types: a field added to a core message reaches its mirror, `plain` and `to_core`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import pytest
from pydantic import ValidationError

from megha.common import models
from megha.common.wire.mirror import CORE_MIRRORS, CoreMirror


class _Pair(NamedTuple):
    left: int
    right: tuple[int, ...]


@dataclass(slots=True)
class _Probe:
    name: str
    pairs: list[_Pair]
    by_user: dict[str, tuple[int, ...]] | None = None
    maybe: _Pair | None = None
    attempt: int = 1
    tags: list[str] = field(default_factory=list)


@pytest.fixture
def probe_mirrors() -> Iterator[tuple[type[CoreMirror], type[CoreMirror]]]:
    """Mirrors of two core types defined here, taken out of the registry afterwards."""

    class PairModel(CoreMirror, core=_Pair):
        """Mirror of `_Pair`."""

    class ProbeModel(CoreMirror, core=_Probe):
        """Mirror of `_Probe`."""

    yield PairModel, ProbeModel
    del CORE_MIRRORS[_Pair], CORE_MIRRORS[_Probe]


def test_a_mirror_has_every_field_of_its_core_type_with_its_default(
    probe_mirrors: tuple[type[CoreMirror], type[CoreMirror]],
) -> None:
    pair_model, probe_model = probe_mirrors
    assert list(probe_model.model_fields) == ["name", "pairs", "by_user", "maybe", "attempt", "tags"]
    assert probe_model.model_fields["pairs"].annotation == list[pair_model]
    obj = _Probe("p", [_Pair(1, (2, 3))], {"u": (4,)}, _Pair(0, (1,)), 2, ["a"])
    assert probe_model.plain(obj) == {
        "name": "p",
        "pairs": [{"left": 1, "right": [2, 3]}],
        "by_user": {"u": [4]},
        "maybe": {"left": 0, "right": [1]},
        "attempt": 2,
        "tags": ["a"],
    }
    back = probe_model.model_validate_json(probe_model.core_json(obj)).to_core()
    assert back == obj and type(back.pairs[0]) is _Pair and type(back.pairs[0].right) is tuple
    assert probe_model.model_validate({"name": "p", "pairs": []}).to_core() == _Probe("p", [])


def test_field_types_shared_by_name_and_by_core_type_are_checked(
    probe_mirrors: tuple[type[CoreMirror], type[CoreMirror]],
) -> None:
    _, probe_model = probe_mirrors
    for body, field_name in (
        ({"name": "p", "pairs": [], "attempt": 0}, "attempt"),  # FIELD_TYPES: an attempt is at least 1
        ({"name": "", "pairs": []}, "name"),  # a str is a name: not empty
        ({"name": "p", "pairs": [{"left": -1, "right": [1]}]}, "pairs.0.left"),  # an int is an index
        ({"name": "p", "pairs": [{"left": 1, "right": []}]}, "pairs.0.right"),  # a resource vector is not empty
    ):
        with pytest.raises(ValidationError) as err:
            probe_model.model_validate(body)
        assert [d.field for d in models.validation_error_body(err.value).detail] == [field_name]


def test_a_mirror_refuses_to_declare_a_field_its_core_type_lacks() -> None:
    with pytest.raises(TypeError, match=r"declares fields \['extra'\] that _Pair lacks"):

        class _Wrong(CoreMirror, core=_Pair):
            extra: int = 0
