"""`megha` is one click group, and each option of `replay` and `local` that is also a setting is defined once: by
the settings model's field (megha/options.py), whose type, bounds, choices and description both commands show."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from clikit import run_cli

from megha import cli, options
from megha.common.settings import FairSettings, LMSettings, LoadgenSettings, WorkerSettings
from megha.options import Bounded, OneOf

SHARED = [  # (option, model, field): options of both commands generated from one field
    ("--trace", LoadgenSettings, "trace"),
    ("--mode", LoadgenSettings, "mode"),
    ("--share-policy", FairSettings, "share_policy"),
    ("--delta-interval", LMSettings, "delta_interval"),
    ("--node-cpu", WorkerSettings, "node_cpu_millicores"),
]


def _help(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main([command, "--help"])
    assert exc.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def _param(command: str, flag: str):  # type: ignore[no-untyped-def]
    (param,) = [p for p in cli.megha.commands[command].params if flag in p.opts]
    return param


@pytest.mark.parametrize(("flag", "model", "name"), SHARED, ids=[s[0] for s in SHARED])
def test_both_commands_describe_and_type_a_shared_option_as_its_setting(
    flag: str, model: type, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    field = model.model_fields[name]
    description = " ".join(field.description.split())
    for command in ("replay", "local"):
        assert description in _help(command, capsys), (command, flag)
        kind = _param(command, flag).type
        bounds = {bound: getattr(m, bound) for m in field.metadata for bound in ("ge", "gt") if hasattr(m, bound)}
        if isinstance(kind, Bounded):
            assert (kind.ge, kind.gt) == (bounds.get("ge"), bounds.get("gt")), (command, flag)
        elif isinstance(kind, OneOf):
            assert set(kind.choices) == set(field.annotation.__args__), (command, flag)


def test_each_command_keeps_its_own_defaults() -> None:
    assert _param("replay", "--trace").default == "syn:250:200" and _param("local", "--trace").default == "demo"
    assert _param("replay", "--mode").default == "slot" and _param("local", "--mode").default == "scaled"
    assert _param("local", "--mem-scale").default == 1000 and LoadgenSettings.model_fields["mem_scale"].default == 50
    assert _param("replay", "--node-cpu").default == 64000 and _param("local", "--node-cpu").default == 2000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["local", "--cpu-scale", "0"], "megha local: error: --cpu-scale: must be at least 1, got 0"),
        (["replay", "--first-jobs", "0"], "megha replay: error: --first-jobs: must be at least 1, got 0"),
        (["local", "--mode", "big"], "megha local: error: --mode: invalid choice: 'big'"),
        (["replay", "--queues", "a:b"], "megha replay: error: --queues: queue 0: 'a:b' is not user:share:gm"),
        (["replay", "--time-scale", "nan"], "megha replay: error: --time-scale: must be finite"),
        (["local", "--execution", "fast"], "megha local: error: --execution: invalid choice: 'fast'"),
        (["replay", "--lms"], "megha replay: error: Option '--lms' requires an argument"),
        (["local", "--run-id", "no spaces"], "megha local: error: --run-id: 'no spaces' does not match"),
        (["replay", "--no-such"], "megha replay: error: No such option '--no-such'"),
        (["reproduce"], "megha reproduce: error: Missing argument 'ID|list|all'"),
        (["job", "status"], "megha job status: error: Missing argument 'JOB_ID'"),
        (["top", "--timeout", "nan"], "megha top: error: --timeout: must be finite, got nan"),
        (["top", "--interval", "inf"], "megha top: error: --interval: must be finite, got inf"),
        (["top", "--interval", "0.05"], "megha top: error: --interval: must be >= 0.1, got 0.05"),
        (["job", "list", "--timeout", "0"], "megha job list: error: --timeout: must be > 0, got 0"),
        (["top", "--interval", "1e300"], "megha top: error: --interval: must be <= 86400, got 1e300"),
        (["nodes", "--timeout", "1e300"], "megha nodes: error: --timeout: must be <= 86400, got 1e300"),
        (["replay", "--hop-delay", "1e300"], "megha replay: error: --hop-delay: must be <= 1e+12, got 1e300"),
        (["job", "submit", "--duration", "nan"], "megha job submit: error: --duration: must be finite, got nan"),
        (["replay", "--trace", "syn:1:1", "--gangs", "nan"], "megha replay: error: --gangs: must be finite, got nan"),
        (["replay", "--fail-fraction", "2"], "megha replay: error: --fail-fraction: must be <= 1, got 2"),
    ],
)
def test_a_usage_error_is_one_line_naming_the_option_and_exit_status_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(message), err


@pytest.mark.parametrize("content", [bytes(range(256)), b"not a certificate\n"], ids=["binary", "text"])
@pytest.mark.parametrize("given", ["option", "variable"])
def test_a_ca_file_that_is_not_pem_certificates_is_one_line_naming_the_option_and_the_file(
    content: bytes, given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(content)
    argv = ["job", "submit", "--duration", "1", "--gm", "http://127.0.0.1:9"]
    if given == "option":
        argv += ["--ca", str(ca)]
    else:
        monkeypatch.setenv("MEGHA_TLS_CA", str(ca))
    status, err = run_cli(argv, capsys)
    named = f"{ca} (MEGHA_TLS_CA)" if given == "variable" else str(ca)
    assert status == 2 and err.startswith(f"megha job submit: error: --ca: {named}: not a PEM bundle"), err


@pytest.mark.parametrize("workers", ["99999999999", "100000000"])
def test_a_data_centre_too_large_for_memory_is_one_line_before_it_is_built(
    workers: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, err = run_cli(["replay", "--workers-per-partition", workers, "--trace", "syn:1:1"], capsys)
    nodes = 25 * int(workers)
    assert status == 2, err
    assert err.startswith(f"megha replay: error: this replay (1 task on {nodes:,} nodes, 6 copies"), err
    assert "GB of memory, more than the" in err and err.endswith("or a smaller data centre"), err


def test_the_operating_commands_and_chaos_are_in_the_same_group(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["job", "list", "--gm", "localhost:8000"]) == 2  # megha/ctl.py's own error, its exit status
    assert "not an http" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["chaos", "--help"])  # chaos parses its own options
    assert exc.value.code == 0 and "usage: megha chaos" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    commands = ("replay", "local", "gm", "lm", "worker", "loadgen", "chaos", *cli.CTL_COMMANDS)
    assert all(f"  {name} " in out for name in commands), out


def test_setting_fields_json_is_what_the_models_give(tmp_path: Path) -> None:
    # In a fresh interpreter: the fields are collected as megha.cli generates its options.
    command = [sys.executable, "-m", "megha.options", "--check"]
    check = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    document = json.loads(options.FIELDS_FILE.read_text())
    for key, spec in document["fields"].items():
        assert options.describe_field(*key.split(".")) == spec, key


def test_a_setting_fields_json_of_another_settings_source_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    assert options._generated_fields()
    monkeypatch.setattr(options, "_settings_digest", lambda: -1)
    assert options._generated_fields() == {}  # then field_spec reads each field from its model


def test_the_command_line_starts_without_pydantic(tmp_path: Path) -> None:
    # In a fresh interpreter: `megha replay` and `megha local` need no settings model until `local` runs.
    check = (
        "import sys, megha.console\n"
        "print(sorted(m for m in sys.modules if m.startswith(('pydantic', 'megha.common.settings'))))"
    )
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert done.stdout.strip() == "[]"


def test_ctrl_c_during_a_replay_is_one_line_and_exit_status_130(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "megha.cli", "replay", "--trace", "syn:1000:400", "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    first = proc.stderr.readline()
    assert first.startswith("replaying 400 jobs"), first  # the replay has begun
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert proc.stderr.read() == "megha replay: interrupted\n"
    assert not out.exists()
