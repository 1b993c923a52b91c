"""Running the `megha` command in process, as a test of its command line errors does."""

from __future__ import annotations

import pytest

from megha import cli


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str], max_length: int | None = None) -> tuple[int, str]:
    """`megha <argv>`'s exit status and its stderr, which must be one line (of at most `max_length` characters if
    given) and no traceback: a bad option stops click with SystemExit, a bad value the command refuses is returned."""
    try:
        status = cli.main(argv)
    except SystemExit as exc:
        status = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err[:1000]
    if max_length is not None:
        assert len(err) < max_length, err[:1000]
    return status, err
