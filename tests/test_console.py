"""The `megha` console script (`megha/console.py`): the command line's `script`, imported with the cyclic collector
off and its modules frozen, after which the collector is on again for the command."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_console_script_is_megha_console_script() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["megha"] == "megha.console:script"


def test_importing_it_leaves_the_collector_on_and_the_command_lines_modules_frozen(tmp_path: Path) -> None:
    # In a fresh interpreter: freezing is process-wide, so this test's own process must not import it.
    check = (
        "import gc; assert gc.get_freeze_count() == 0\n"
        "import megha.console, megha.cli\n"
        "assert megha.console.script is megha.cli.script\n"
        "print(gc.isenabled(), gc.get_freeze_count() > 10_000)"
    )
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert done.stdout.split() == ["True", "True"]
