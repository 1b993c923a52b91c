"""The command line's options, each defined once: an option that is also a setting (MEGHA_*) is generated from the
settings model's field (its type, bounds, choices and description), so `megha replay`, `megha local` and the
services read one definition; a command gives its own default or wording only where it differs.

Errors name the option in one line, e.g. "--lms: must be at least 1, got 0" (`usage_line`)."""

from __future__ import annotations

import functools
import math
import re
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, Literal, Union

import annotated_types
import click
from pydantic import BaseModel

FIELD_DEFAULT: Any = object()
"""`setting(default=...)` left out: the field's own default."""

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
    model: type[BaseModel],
    name: str,
    *decls: str,
    default: Any = FIELD_DEFAULT,
    help: str | None = None,
    group: str = "options",
    check: Callable[[str], object] | None = None,
    dest: str | None = None,
) -> Decorator:
    """A click option for `model`'s field `name`: named `--<name>` (or `decls`; its parameter `dest` or `name`),
    typed, bounded and described as the field is, with the field's default unless `default` is given, and `help`
    instead of its description; a string must match the field's pattern, and a string field with a validator
    passes it as `check`."""
    field = model.model_fields[name]
    annotation = _unwrap(field.annotation)
    kind: click.ParamType | type
    if typing.get_origin(annotation) is Literal:
        kind = OneOf([str(c) for c in typing.get_args(annotation)])
    elif annotation in (int, float):
        ge = next((m.ge for m in field.metadata if isinstance(m, annotated_types.Ge)), None)
        gt = next((m.gt for m in field.metadata if isinstance(m, annotated_types.Gt)), None)
        le = next((m.le for m in field.metadata if isinstance(m, annotated_types.Le)), None)
        kind = Bounded(annotation, ge, gt, le)  # type: ignore[arg-type]
    elif check is not None:
        kind = Checked(check)
    elif pattern := next((m.pattern for m in field.metadata if getattr(m, "pattern", None)), None):
        kind = Checked(functools.partial(_matches, pattern))
    else:
        kind = click.STRING
    value = field.get_default(call_default_factory=True) if default is FIELD_DEFAULT else default
    return click.option(
        *(decls or (f"--{name.replace('_', '-')}",)),
        dest or name,
        cls=GroupedOption,
        group=group,
        type=kind,
        default=value,
        show_default=value is not None and value != "",
        required=False,
        help=help or field.description or "",
    )


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
