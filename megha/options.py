"""The command line's options, each defined once: an option that is also a setting (MEGHA_*) is generated from the
settings model's field (its type, bounds, choices and description), so `megha replay`, `megha local` and the
services read one definition; a command gives its own default or wording only where it differs.

What the options take of the fields is kept in setting_fields.json, generated from the models (`python -m
megha.options --write`; tests/test_cli_options.py checks it is current), so that the command line starts without
importing pydantic and the settings models (about 0.3 s). While common/settings.py is not the source the
file was generated from, the options read the models themselves.

Errors name the option in one line, e.g. "--lms: must be at least 1, got 0" (`usage_line`)."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import re
import sys
import types
import typing
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, Union

import click

FIELD_DEFAULT: Any = object()
"""`setting(default=...)` left out: the field's own default."""

FIELDS_FILE = Path(__file__).with_name("setting_fields.json")
"""The fields of the settings models the options are generated from, as `field_spec` gives them, and the CRC-32 of
the common/settings.py they were generated from."""

FieldSpec = dict[str, Any]
"""What an option takes of a settings field: its `kind` ("choice" with `choices`; "int" or "float" with bounds `ge`,
`gt` and `le`, each None when absent; "text" with a `pattern` or None), `default` and `description`."""

_fields: dict[str, FieldSpec] | None = None  # setting_fields.json's fields once read ({}: the models' own are read)
used_fields: dict[str, FieldSpec] = {}
"""Every field an option was generated from so far ("<model>.<field>": its spec): what setting_fields.json holds."""

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


class Bounded(click.ParamType):
    """An integer or a finite float with an optional lower bound (`ge` or `gt`) and upper bound (`le`)."""

    def __init__(
        self, kind: type[int] | type[float], ge: float | None = None, gt: float | None = None, le: float | None = None
    ) -> None:
        self.kind, self.ge, self.gt, self.le = kind, ge, gt, le
        self.name = kind.__name__

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, self.kind) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = self.kind(value)
            except (TypeError, ValueError):
                self.fail(f"not {'an integer' if self.kind is int else 'a number'}: {value!r}", param, ctx)
        if self.kind is float and not math.isfinite(number):
            self.fail(f"must be finite, got {value}", param, ctx)
        if self.ge is not None and number < self.ge:
            bound = f"at least {self.ge}" if self.kind is int else f">= {self.ge:g}"
            self.fail(f"must be {bound}, got {value}", param, ctx)
        if self.gt is not None and number <= self.gt:
            self.fail(f"must be > {self.gt:g}, got {value}", param, ctx)
        if self.le is not None and number > self.le:
            bound = f"at most {self.le}" if self.kind is int else f"<= {self.le:g}"
            self.fail(f"must be {bound}, got {value}", param, ctx)
        return number


class OneOf(click.Choice):
    """A choice whose refusal says "invalid choice" and lists the choices."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value in self.choices:
            return value
        self.fail(f"invalid choice: {value!r} (choose from {', '.join(map(str, self.choices))})", param, ctx)


class Checked(click.ParamType):
    """A string `check` accepts (it raises ValueError, whose message is shown, for one it does not)."""

    name = "text"

    def __init__(self, check: Callable[[str], object]) -> None:
        self.check = check

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value:
            try:
                self.check(value)
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        return value


class GroupedOption(click.Option):
    """An option listed under a heading (`group`) in its command's --help."""

    def __init__(self, *args: Any, group: str = "options", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group = group


class GroupedCommand(click.Command):
    """A command whose --help lists its options under their groups' headings, in the order they were declared."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        groups: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                groups.setdefault(getattr(param, "group", "options"), []).append(record)
        for group, records in groups.items():
            with formatter.section(group):
                formatter.write_dl(records)


def setting(
    model: str,
    name: str,
    *decls: str,
    default: Any = FIELD_DEFAULT,
    help: str | None = None,
    group: str = "options",
    check: Callable[[str], object] | None = None,
    dest: str | None = None,
) -> Decorator:
    """A click option for the field `name` of `model` (a settings model of megha.common.settings, by name): named
    `--<name>` (or `decls`; its parameter `dest` or `name`), typed, bounded and described as the field is, with the
    field's default unless `default` is given, and `help` instead of its description; a string must match the
    field's pattern, and a string field with a validator passes it as `check`."""
    spec = field_spec(model, name)
    kind: click.ParamType | type
    if spec["kind"] == "choice":
        kind = OneOf(spec["choices"])
    elif spec["kind"] in ("int", "float"):
        kind = Bounded(int if spec["kind"] == "int" else float, spec["ge"], spec["gt"], spec["le"])
    elif check is not None:
        kind = Checked(check)
    elif spec["pattern"]:
        kind = Checked(functools.partial(_matches, spec["pattern"]))
    else:
        kind = click.STRING
    value = spec["default"] if default is FIELD_DEFAULT else default
    return click.option(
        *(decls or (f"--{name.replace('_', '-')}",)),
        dest or name,
        cls=GroupedOption,
        group=group,
        type=kind,
        default=value,
        show_default=value is not None and value != "",
        required=False,
        help=help or spec["description"],
    )


def field_spec(model: str, name: str) -> FieldSpec:
    """The field `name` of the settings model `model` as an option takes it (`FieldSpec`): from setting_fields.json
    while common/settings.py is the source it was generated from, else from the model."""
    global _fields
    if _fields is None:
        _fields = _generated_fields()
    key = f"{model}.{name}"
    spec = _fields.get(key) or describe_field(model, name)
    used_fields[key] = spec
    return spec


def describe_field(model: str, name: str) -> FieldSpec:
    """`field_spec` read from the model itself (importing pydantic and the settings models)."""
    import annotated_types

    from megha.common import settings

    field = getattr(settings, model).model_fields[name]
    annotation = _unwrap(field.annotation)
    spec: FieldSpec
    if typing.get_origin(annotation) is Literal:
        spec = {"kind": "choice", "choices": [str(c) for c in typing.get_args(annotation)]}
    elif annotation in (int, float):
        bounds = {"ge": annotated_types.Ge, "gt": annotated_types.Gt, "le": annotated_types.Le}
        spec = {"kind": annotation.__name__}
        for bound, kind in bounds.items():
            spec[bound] = next((getattr(m, bound) for m in field.metadata if isinstance(m, kind)), None)
    else:
        spec = {
            "kind": "text",
            "pattern": next((m.pattern for m in field.metadata if getattr(m, "pattern", None)), None),
        }
    default = field.get_default(call_default_factory=True)
    return {**spec, "default": default, "description": field.description or ""}


def _generated_fields() -> dict[str, FieldSpec]:
    """setting_fields.json's fields; none when it is missing or was generated from another common/settings.py."""
    try:
        generated = json.loads(FIELDS_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    fields: dict[str, FieldSpec] = generated["fields"]
    return fields if generated.get("settings_crc32") == _settings_digest() else {}


def _settings_digest() -> int | None:
    """The CRC-32 of common/settings.py, found without importing it (None: not found): enough to tell an edited
    source from the one setting_fields.json was generated from, and zlib is imported already (hashlib is not)."""
    spec = importlib.util.find_spec("megha.common.settings")
    if spec is None or spec.origin is None:
        return None
    try:
        return zlib.crc32(Path(spec.origin).read_bytes())
    except OSError:
        return None


def generated_document() -> str:
    """setting_fields.json as the models give it now: the fields the command line's options are generated from,
    read from the models while megha.cli is imported. Needs a process that has not imported megha.cli yet."""
    global _fields
    if "megha.cli" in sys.modules:
        raise RuntimeError("megha.cli is imported already: its options were generated before")
    _fields = {}
    import megha.cli  # noqa: F401 (generates every option)

    document = {"settings_crc32": _settings_digest(), "fields": dict(sorted(used_fields.items()))}
    return json.dumps(document, indent=1, sort_keys=True) + "\n"


def option(*decls: str, group: str = "options", **kwargs: Any) -> Decorator:
    """A click option that is no setting (it belongs to one command line), listed under `group`."""
    if "default" in kwargs and kwargs["default"] not in (None, False, "", ()):
        kwargs.setdefault("show_default", True)
    return click.option(*decls, cls=GroupedOption, group=group, **kwargs)


def options(*decorators: Decorator) -> Decorator:
    """Several options as one decorator, listed in the order given."""

    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        for decorate in reversed(decorators):
            f = decorate(f)
        return f

    return apply


def positive(kind: type[int] | type[float]) -> Bounded:
    """An option type of integers >= 1 or floats > 0."""
    return Bounded(kind, ge=1) if kind is int else Bounded(kind, gt=0)


def usage_line(exc: click.UsageError) -> str:
    """A usage error in one line, naming the option: "--lms: must be at least 1, got 0"."""
    if isinstance(exc, click.MissingParameter):  # its message is made by format_message
        return exc.format_message().rstrip(".")
    if isinstance(exc, click.BadParameter) and exc.param is not None:
        opts: Sequence[str] = getattr(exc.param, "opts", ())
        name = max(opts, key=len) if opts else exc.param.name
        return f"{name}: {exc.message.rstrip('.')}"
    if isinstance(exc, click.BadParameter) and isinstance(exc.param_hint, str):
        return f"{exc.param_hint}: {exc.message.rstrip('.')}"
    return exc.message.rstrip(".")


def _matches(pattern: str, value: str) -> None:
    if not re.fullmatch(pattern, value):
        raise ValueError(f"{value!r} does not match {pattern}")


def _unwrap(annotation: Any) -> Any:
    """`X | None` -> X; anything else as it is."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def main(argv: list[str]) -> int:
    """`python -m megha.options --write`: regenerate setting_fields.json; `--check`: status 1 if it is not current."""
    if argv not in (["--write"], ["--check"]):
        print("usage: python -m megha.options --write | --check", file=sys.stderr)
        return 2
    document = generated_document()
    if argv == ["--write"]:
        FIELDS_FILE.write_text(document, encoding="utf-8")
        return 0
    current = FIELDS_FILE.read_text(encoding="utf-8") if FIELDS_FILE.exists() else ""
    if current != document:
        print(f"{FIELDS_FILE} is not current: python -m megha.options --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from megha import options  # the module megha.cli imports, not this copy run as __main__

    sys.exit(options.main(sys.argv[1:]))
