"""Repository hygiene: the README's commands, CI, and packaging stay in step with the code."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README must open with a bash block of set-up commands"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_opens_with_the_two_set_up_commands() -> None:
    run, test = _readme_commands()
    assert run.endswith("megha replay")
    assert "pytest" in test and "[test]" in test


def test_ci_runs_exactly_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == _readme_commands()[1]


def test_every_package_folder_is_declared_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(config["packages"])
    mapping = config["package-dir"]
    found = set()
    for name, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]))
    assert found == declared, f"undeclared: {found - declared}; missing: {declared - found}"


def test_entry_point_resolves() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    module, func = config["project"]["scripts"]["megha"].split(":")
    mod = __import__(module, fromlist=[func])
    assert callable(getattr(mod, func))
