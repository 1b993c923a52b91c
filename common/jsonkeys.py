"""JSON objects read from files that come from elsewhere (cluster files, job files): a key given twice in one object
is refused, since JSON readers disagree on which of the two wins (Python's, the last)."""

from __future__ import annotations

from typing import Any


class KeyTwiceError(ValueError):
    """A key given twice in one JSON object or YAML mapping (the message names it)."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`' `object_pairs_hook`: the object's dict, or KeyTwiceError naming a key given twice in it."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        keys = [key for key, _ in pairs]
        twice = next(key for key in keys if keys.count(key) > 1)
        raise KeyTwiceError(f"key {twice[:40]!r} given twice in one object")
    return obj
