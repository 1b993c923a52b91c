"""The body of every 4xx answer, and the 422 body of a validation failure naming each offending field."""

from __future__ import annotations

from pydantic import ValidationError

from megha.common.wire.fields import WireModel

ROOT_FIELD = "(body)"
"""The field name of an error about the body as a whole (say, malformed JSON)."""


class FieldError(WireModel):
    """One invalid field: its dotted path ("tasks.3.cpu_millicores", "(body)" for the body as a whole)."""

    field: str
    message: str


class ErrorBody(WireModel):
    """Body of every 4xx response."""

    error: str
    detail: list[FieldError] = []


def validation_error_body(exc: ValidationError) -> ErrorBody:
    """The 422 body for a validation failure, naming each offending field by its dotted path."""
    return ErrorBody(
        error=f"invalid {exc.title}",
        detail=[
            FieldError(field=".".join(str(part) for part in e["loc"]) or ROOT_FIELD, message=e["msg"])
            for e in exc.errors()
        ],
    )
