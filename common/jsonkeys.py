"""JSON objects read from files that come from elsewhere (cluster files, job files) and from users' request bodies: a
key given twice in one object is refused, since JSON readers disagree on which of the two wins (Python's and
pydantic's, the last)."""

from __future__ import annotations

import json
from typing import Any


class KeyTwiceError(ValueError):
    """A key given twice in one JSON object or YAML mapping (the message names it)."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`' `object_pairs_hook`: the object's dict, or KeyTwiceError naming a key given twice in it."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))  # one pass: a body may hold 10**6 keys
        raise KeyTwiceError(f"key {twice[:40]!r} given twice in one object")
    return obj


def key_twice(text: str | bytes) -> tuple[str | int, ...] | None:
    """Where the JSON document `text` first gives a key twice in one object: the path to that key, keys and list
    indices as pydantic locates a field (`("tasks", 0, "env", "A")`); None when no object does. ValueError when
    `text` is not JSON. One pass when no key is given twice; a second finds the path when one is."""
    try:
        json.loads(text, object_pairs_hook=unique_keys)
    except KeyTwiceError:
        return _twice_in(json.loads(text, object_pairs_hook=_Pairs), ())
    return None


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its (key, value) pairs in order, a key given twice kept twice."""


def _twice_in(value: Any, path: tuple[str | int, ...]) -> tuple[str | int, ...] | None:
    """The path of the first key given twice in `value` (parsed with `_Pairs` objects), within `path`."""
    if isinstance(value, _Pairs):
        seen: set[str] = set()
        for key, item in value:
            if key in seen:
                return (*path, key)
            seen.add(key)
            if (found := _twice_in(item, (*path, key))) is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if (found := _twice_in(item, (*path, index))) is not None:
                return found
    return None
