"""What every `megha job|queues|nodes|top` command shares: where the GMs and LMs are, the client that asks them
(megha.client), how a refusal or an unreachable service becomes one line and an exit status, and table helpers.
"""

from __future__ import annotations

import functools
import json
import os
import ssl
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click
from click.core import ParameterSource
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from megha.client import DEFAULT_GM_URL, Client, MeghaError
from megha.client.plans import check_token, gm_urls
from megha.common.core.resources import CPU, MEMORY
from megha.options import Bounded

REFUSED, USAGE, UNREACHABLE, UNFINISHED = 1, 2, 3, 4
RESOURCE_LABELS = {CPU: "CPU m", MEMORY: "memory MB"}
T = TypeVar("T")


class CtlError(click.ClickException):
    """One line on stderr, `megha: <message>`, and the exit status `exit_code`."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file: Any = None) -> None:
        click.echo(f"megha: {self.message}", err=True)


@dataclass
class Ctl:
    """What every command gets: the GMs and LMs to ask, the client, and how to print."""

    gms: list[str]
    lms: list[str]
    client: Client  # of every GM: a call about a job goes to the GM that holds it; `at(url)` for one service
    as_json: bool
    console: Console = field(default_factory=lambda: Console(markup=False, highlight=False, soft_wrap=True))

    def emit(self, data: object) -> None:
        click.echo(json.dumps(data, indent=2))

    def print(self, *renderables: object) -> None:
        self.console.print(*renderables)

    def failure(self, exc: MeghaError) -> CtlError:
        """A client's error as one line: `GM at URL answered 404: ...` (exit status 1) or `... cannot be reached:
        ...` (3)."""
        where = f"{'LM' if exc.url in self.lms else 'GM'} at {exc.url}"
        if exc.status is None:
            return CtlError(f"{where} cannot be reached: {exc.reason}", UNREACHABLE)
        hint = " (give your API token with --token or $MEGHA_API_TOKEN)" if exc.status == 401 else ""
        return CtlError(f"{where} answered {exc.status}: {exc.reason}{hint}", REFUSED)

    def each(self, urls: Sequence[str], ask: Callable[[Client], T]) -> tuple[list[tuple[str, T]], list[CtlError]]:
        """`ask` the client of every service: the answers of those that answered, and the errors of those that could
        not be reached (the first error is raised when none answered; a refusal at once)."""
        answers, errors = [], []
        for url in urls:
            try:
                answers.append((url, ask(self.client.at(url))))
            except MeghaError as exc:
                if exc.status is not None:
                    raise self.failure(exc) from None
                errors.append(self.failure(exc))
        if errors and not answers:
            raise errors[0]
        return answers, errors


def dump(model: BaseModel) -> Any:
    """A model as the JSON the service sent."""
    return model.model_dump(mode="json")


def _urls(option: str, given: Sequence[str], variables: Sequence[str], default: str | None) -> list[str]:
    """URLs from `option` (repeatable, or comma-separated), else from the first variable set, else `default`; a bad
    one is a usage error naming where it came from."""
    variable = next((v for v in variables if os.environ.get(v, "").strip()), None)
    texts = list(given) or ([os.environ[variable]] if variable else [])
    if not texts and default is None:
        return []
    where = option if given else variable or option
    try:
        return gm_urls(texts or [default or ""])
    except ValueError as exc:
        raise CtlError(f"{where}: {exc}", USAGE) from None


def _from_env(ctx: click.Context, param: click.Parameter, variable: str) -> str:
    """` (VARIABLE)` when the option's value came from that variable, to name it in an error; else nothing."""
    return f" ({variable})" if ctx.get_parameter_source(param.name or "") is ParameterSource.ENVIRONMENT else ""


def _token(ctx: click.Context, param: click.Parameter, token: str | None) -> str | None:
    """`--token` (or MEGHA_API_TOKEN): refused before any call unless visible ASCII, without printing it."""
    if token:
        try:
            check_token(token, f"--token{_from_env(ctx, param, 'MEGHA_API_TOKEN')}")
        except ValueError as exc:
            raise click.UsageError(str(exc), ctx) from None
    return token


def _ca_bundle(ctx: click.Context, param: click.Parameter, path: str | None) -> str | None:
    """`--ca` (or MEGHA_TLS_CA): a file of PEM certificates, refused before any call when ssl cannot load it."""
    if path:
        try:
            ssl.create_default_context(cafile=path)
        except OSError as exc:  # ssl.SSLError (not PEM certificates) or the file cannot be read
            given = _from_env(ctx, param, "MEGHA_TLS_CA")
            if isinstance(exc, ssl.SSLError):
                reason = f"not a PEM bundle of certificates ({exc.reason or exc})"
            else:
                reason = exc.strerror or str(exc)
            raise click.BadParameter(f"{path}{given}: {reason}", ctx, param) from None
    return path


def options(lms: bool = False) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The options every command shares (`--gm`, `--json`, `--token`, `--ca`, `--timeout`; `--lm` when `lms`),
    passed as a `Ctl`."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(command)
        def run(
            gm: tuple[str, ...],
            lm: tuple[str, ...] = (),
            as_json: bool = False,
            timeout: float = 10.0,
            token: str | None = None,
            ca: str | None = None,
            **kw: Any,
        ) -> None:
            gms = _urls("--gm", gm, ("MEGHA_GM_URL", "MEGHA_GM_URLS"), DEFAULT_GM_URL)
            try:
                client = Client(gms, token=token, ca=ca, timeout=timeout)
            except ValueError as exc:  # MEGHA_API_TOKEN_FILE cannot be read, or both token variables are set
                raise CtlError(str(exc), USAGE) from None
            ctl = Ctl(gms, _urls("--lm", lm, ("MEGHA_LM_URLS",), None), client, as_json)
            try:
                command(ctl, **kw)
            except MeghaError as exc:
                raise ctl.failure(exc) from None
            finally:
                client.close()

        decorators = [
            click.option(
                "--gm",
                multiple=True,
                metavar="URL",
                help=f"a GM's URL; repeat it or separate with commas for several (default: $MEGHA_GM_URL, else "
                f"$MEGHA_GM_URLS, else {DEFAULT_GM_URL})",
            ),
            click.option("--json", "as_json", is_flag=True, help="print the API's JSON instead of a table"),
            click.option(
                "--token",
                envvar="MEGHA_API_TOKEN",
                metavar="TOKEN",
                callback=_token,
                help="your API token (default: $MEGHA_API_TOKEN, or the file $MEGHA_API_TOKEN_FILE names; not both); "
                "none is sent without one (a deployment with MEGHA_AUTH=off)",
            ),
            click.option(
                "--ca",
                envvar="MEGHA_TLS_CA",
                metavar="FILE",
                type=click.Path(exists=True, dir_okay=False),
                callback=_ca_bundle,
                help="PEM bundle of the certificate authorities that verify https:// GMs and LMs (default: "
                "$MEGHA_TLS_CA, else the system's)",
            ),
            click.option(
                "--timeout",
                type=Bounded(float, gt=0, le=86400),
                default=10.0,
                show_default=True,
                help="seconds to wait for each answer (at most 86400)",
            ),
        ]
        if lms:
            decorators.append(
                click.option(
                    "--lm",
                    multiple=True,
                    metavar="URL",
                    help="an LM's URL; repeat it or separate with commas (default: $MEGHA_LM_URLS)",
                )
            )
        for decorator in decorators:
            run = decorator(run)
        return run

    return decorate


# ------------------------------------------------------------------------------------------------ formatting


def table(title: str | None, *columns: str, numeric: Iterable[str] = ()) -> Table:
    made = Table(title=title, title_justify="left", title_style="bold")
    right = set(numeric)
    for column in columns:
        numbers = column in right
        made.add_column(
            column, justify="right" if numbers else "left", overflow="fold", min_width=len(column) * numbers
        )
    return made


def when(t: float | None) -> str:
    if t is None:
        return "-"
    fmt = "%H:%M:%S" if time.strftime("%Y-%m-%d", time.localtime(t)) == time.strftime("%Y-%m-%d") else "%m-%d %H:%M"
    return time.strftime(fmt, time.localtime(t))


def seconds(start: float | None, end: float | None) -> str:
    return "-" if start is None or end is None else f"{end - start:.3f}"


def counts(states: dict[str, int]) -> str:
    return ", ".join(f"{n} {state}" for state, n in states.items() if n) or "-"


def amounts(free: Sequence[int], capacity: Sequence[int]) -> list[str]:
    return [f"{f:,}/{c:,}" for f, c in zip(free, capacity)]


def label(resource: str) -> str:
    return RESOURCE_LABELS.get(resource, resource)


def used(free: Sequence[int], capacity: Sequence[int]) -> str:
    """The largest used fraction over the resources, in percent."""
    fractions = [1 - f / c for f, c in zip(free, capacity) if c]
    return f"{100 * max(fractions):.0f}%" if fractions else "-"


def total(vectors: Iterable[Sequence[int]], width: int) -> list[int]:
    summed = [0] * width
    for vector in vectors:
        for k, amount in enumerate(vector):
            summed[k] += amount
    return summed
