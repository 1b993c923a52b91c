"""Wire models derived from the core's dataclasses: each mirror's fields, `plain()` and `to_core()` from one source.

A mirror names its core type, `class PlacementModel(CoreMirror, core=Placement)`, and gets one wire field per field
of that type, in its order and with its default. A field's wire type comes from, first to last:

1. the mirror's own body, for a field whose wire form needs more than its core type says (the bounded strings of
   `RunSpec`);
2. `FIELD_TYPES`, for names that mean the same in every message (`attempt` and `run_number` are at least 1,
   `error` may be "");
3. the core type: `int` an index (>= 0), `str` a name, `float` seconds, a tuple of ints a resource vector, another
   core type its mirror, and lists, optionals and dicts of those.

A field whose value changes form on the wire carries a `Codec` in its type (the constraint mask travels as ids).
Adding a field to a core message is one edit: the mirror, `plain` and `to_core` follow.

`plain(obj)` and `to_core()` are generated as Python source per mirror (as `dataclasses` generates `__init__`): one
dict display or one constructor call, with no per-field loop, so the services' send path (`core_json`) costs what
a hand-written dict would.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, NamedTuple, Self, Union, get_args, get_origin

from pydantic import Field
from pydantic_core import PydanticUndefined, to_json

from megha.common.core.task import MAX_PRIORITY
from megha.common.wire.fields import Amounts, Index, Name, Seconds, Timestamp, WireModel


class Codec(NamedTuple):
    """How a field's value changes form on the wire: `to_wire(core value)` is JSON-ready, `to_core(wire value)`
    gives the core value back. Put it in the field's `Annotated` type."""

    to_wire: Callable[[Any], Any]
    to_core: Callable[[Any], Any]


CORE_MIRRORS: dict[type, type[CoreMirror]] = {}
"""Each core message type and its wire model (filled as the mirrors are defined)."""

FIELD_TYPES: dict[str, Any] = {
    "attempt": Annotated[int, Field(ge=1)],
    "run_number": Annotated[int, Field(ge=1)],
    "error": str,
    "reason": str,
    "at": Timestamp,
    "started_at": Timestamp | None,
    "finished_at": Timestamp | None,
    "exit_code": Annotated[int, Field(ge=0, le=255)] | None,
    "priority": Annotated[int, Field(ge=0, le=MAX_PRIORITY)],  # a delta keys its usage by the value's digits
}
"""Wire types of field names that mean the same in every core message."""

# A conversion writes the expression of a value's other form from the expression `src` of the value; `depth`
# numbers the variables of nested comprehensions. None: the value travels as it is.
_Convert = Callable[[str, int], str] | None


class _Shape(NamedTuple):
    """A core type on the wire: its wire annotation and the conversions both ways."""

    wire: Any
    to_wire: _Convert
    to_core: _Convert


class CoreMirror(WireModel):
    """Base of the mirror of one core message type: `from_core(obj)` and `to_core()` convert losslessly, and
    `plain(obj)` is the JSON-ready form of `obj` (what `from_core(obj).model_dump()` gives)."""

    core_type: ClassVar[type]
    """The core type this model mirrors."""
    plain: ClassVar[Callable[[Any], dict[str, Any]]]
    """The JSON-ready form of a core object (dicts, lists, str, int, float, bool, None), built without models."""

    def __init_subclass__(cls, core: type | None = None, exclude: tuple[str, ...] = (), **kwargs: Any) -> None:
        """Give a mirror of `core` a field per field of `core` (but those in `exclude`, which `to_core` leaves at
        their defaults) before pydantic collects the fields."""
        super().__init_subclass__(**kwargs)
        if core is None:
            return
        declared = inspect.get_annotations(cls)
        hints = typing.get_type_hints(core)
        annotations: dict[str, Any] = {}
        for name, default in _core_fields(core):
            if name in exclude:
                continue
            annotations[name] = declared.get(name) or FIELD_TYPES.get(name) or _shape(hints[name]).wire
            if name not in cls.__dict__ and default is not PydanticUndefined:
                setattr(cls, name, list(default) if type(default) is tuple else default)
        if unknown := set(declared) - set(annotations):
            raise TypeError(f"{cls.__name__} declares fields {sorted(unknown)} that {core.__name__} lacks")
        cls.__annotations__ = annotations
        cls.core_type = core
        CORE_MIRRORS[core] = cls

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if cls.__dict__.get("core_type") is not None:
            _generate(cls)

    @classmethod
    def from_core(cls, obj: Any) -> Self:
        return cls.model_validate(cls.plain(obj))

    @classmethod
    def core_json(cls, obj: Any) -> bytes:
        """The JSON of `from_core(obj)`, without building (or validating) the models: the services' send path."""
        return to_json(cls.plain(obj))

    def to_core(self) -> Any:
        """The core object this model stands for (generated per mirror)."""
        raise NotImplementedError(f"{type(self).__name__} names no core type")


def _core_fields(core: type) -> list[tuple[str, Any]]:
    """(name, wire default) of each field of a dataclass or NamedTuple; PydanticUndefined where it has none."""
    if dataclasses.is_dataclass(core):
        return [
            (
                f.name,
                f.default
                if f.default is not dataclasses.MISSING
                else Field(default_factory=f.default_factory)
                if f.default_factory is not dataclasses.MISSING
                else PydanticUndefined,
            )
            for f in dataclasses.fields(core)
        ]
    defaults = core._field_defaults  # type: ignore[attr-defined]
    return [(name, defaults.get(name, PydanticUndefined)) for name in core._fields]  # type: ignore[attr-defined]


_SCALARS: dict[Any, Any] = {int: Index, str: Name, float: Seconds, bool: bool}


def _shape(hint: Any) -> _Shape:
    """How the core type `hint` travels (see the module's docstring)."""
    if hint in _SCALARS:
        return _Shape(_SCALARS[hint], None, None)
    if hint in CORE_MIRRORS:
        mirror = CORE_MIRRORS[hint]
        return _Shape(mirror, _call(mirror.plain), lambda src, depth: f"{src}.to_core()")
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = _shape(next(a for a in args if a is not type(None)))
        return _Shape(inner.wire | None, _optional(inner.to_wire), _optional(inner.to_core))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        inner = _shape(args[0])
        wire = Amounts if args[0] is int else list[inner.wire]
        return _Shape(wire, _each(inner.to_wire, "list"), _each(inner.to_core, "tuple"))
    if origin is list:
        inner = _shape(args[0])
        return _Shape(list[inner.wire], _each(inner.to_wire, "list"), _each(inner.to_core, "list"))
    if origin is dict:
        key, value = _shape(args[0]), _shape(args[1])
        if key.to_wire is not None:
            raise TypeError(f"dict keys of {hint} must travel as they are")
        return _Shape(dict[key.wire, value.wire], _values(value.to_wire), _values(value.to_core))
    raise TypeError(f"no wire form for the core type {hint}: declare the field's wire type in its mirror")


def _call(function: Callable[[Any], Any]) -> _Convert:
    name = _name(function)
    return lambda src, depth: f"{name}({src})"


def _optional(inner: _Convert) -> _Convert:
    if inner is None:
        return None
    return lambda src, depth: f"(None if (_v{depth} := {src}) is None else {inner(f'_v{depth}', depth + 1)})"


def _each(inner: _Convert, container: str) -> _Convert:
    if inner is None:
        return lambda src, depth: f"{container}({src})"
    bracket = "[{}]" if container == "list" else "tuple({})"
    return lambda src, depth: bracket.format(f"{inner(f'_x{depth}', depth + 1)} for _x{depth} in {src}")


def _values(inner: _Convert) -> _Convert:
    if inner is None:
        return lambda src, depth: f"dict({src})"
    return lambda src, depth: (
        f"{{_k{depth}: {inner(f'_x{depth}', depth + 1)} for _k{depth}, _x{depth} in {src}.items()}}"
    )


_GLOBALS: dict[str, Any] = {}
"""What the generated functions call, by the names `_name` gave them."""
_numbers = itertools.count()


def _name(obj: Any) -> str:
    """A name in `_GLOBALS` for `obj` (what it is called, numbered: tracebacks through generated code read)."""
    called = getattr(obj, "__name__", "")
    name = f"_{called if called.isidentifier() else 'value'}_{next(_numbers)}"
    _GLOBALS[name] = obj
    return name


def _codec(metadata: list[Any]) -> Codec | None:
    return next((m for m in metadata if isinstance(m, Codec)), None)


def _generate(mirror: type[CoreMirror]) -> None:
    """Set `mirror.plain` and `mirror.to_core` from its fields: each converted as its wire type's `Codec` says,
    else as its core type's shape."""
    core = mirror.core_type
    hints = typing.get_type_hints(core)
    items, arguments = [], []
    for name, info in mirror.model_fields.items():
        codec = _codec(info.metadata)
        shape = _Shape(None, _call(codec.to_wire), _call(codec.to_core)) if codec else _shape(hints[name])
        items.append(f"{name!r}: {shape.to_wire(f'obj.{name}', 0) if shape.to_wire else f'obj.{name}'}")
        value = shape.to_core(f"self.{name}", 0) if shape.to_core else f"self.{name}"
        positional = list(hints).index(name) == len(arguments)  # no field of the core type left out before it
        arguments.append(value if positional else f"{name}={value}")
    source = (
        f"def plain(obj):\n    return {{{', '.join(items)}}}\n"
        f"def to_core(self):\n    return {_name(core)}({', '.join(arguments)})\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<mirror of {core.__name__}>", "exec"), _GLOBALS, namespace)
    mirror.plain = staticmethod(namespace["plain"])  # type: ignore[assignment]
    mirror.to_core = namespace["to_core"]  # type: ignore[method-assign]
