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


MAX_FIELD_ERRORS = 50
"""A 422 body names at most this many fields, and says how many more failed: a body of 345,000 unknown keys took
the GM 3.5 s to answer with 21 MB of errors, its other requests waiting meanwhile."""


def validation_error_body(exc: ValidationError) -> ErrorBody:
    """The 422 body for a validation failure, naming each offending field by its dotted path (the first
    MAX_FIELD_ERRORS of them)."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    counted = (
        f" ({len(errors)} errors; the first {MAX_FIELD_ERRORS} are named)" if len(errors) > MAX_FIELD_ERRORS else ""
    )
    return ErrorBody(
        error=f"invalid {exc.title}{counted}",
        detail=[
            FieldError(field=".".join(str(part) for part in e["loc"]) or ROOT_FIELD, message=e["msg"])
            for e in errors[:MAX_FIELD_ERRORS]
        ],
    )
