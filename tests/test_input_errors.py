"""Bad input is one line naming the option, field or path (usage error, exit status 2), never a traceback, a hang
or a silent wrong result: the audit's findings on `megha replay`'s paths, traces and cluster files."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from clikit import run_cli

from megha import cli
from megha.client import Client
from megha.common.clusterfile import ClusterFileError, load_cluster
from megha.loadgen.trace import MAX_SECONDS, TraceError, read_trace, resolve_trace

SMALL = ["--lms", "1", "--gms", "1", "--workers-per-partition", "2", "--quiet"]


_run = run_cli


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "one.tr"
    path.write_text("0 1 1 1\n")
    return path


# 1. paths of the command line


def test_cluster_that_is_a_directory_is_a_usage_error(
    tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, err = _run(["replay", "--trace", str(trace), "--cluster", str(tmp_path), "--no-files", *SMALL], capsys)
    assert status == 2
    assert "--cluster" in err and "is a directory" in err


def test_trace_that_is_a_directory_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, err = _run(["replay", "--trace", str(tmp_path), "--no-files", *SMALL], capsys)
    assert status == 2
    assert "--trace" in err and "is a directory" in err and "no such file" not in err


@pytest.mark.parametrize("below", ["", "sub"])
def test_out_naming_an_existing_file_is_a_usage_error(
    tmp_path: Path, trace: Path, below: str, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "file"
    file.write_text("")
    out = file / below if below else file
    for command in (["replay", *SMALL], ["local"]):
        status, err = _run([*command, "--trace", str(trace), "--out", str(out)], capsys)
        assert status == 2
        assert "--out" in err and str(file) in err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no folder can be made")
def test_out_that_cannot_be_made_is_refused_before_the_replay(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["replay", *SMALL, "--trace", str(trace), "--out", "/proc/megha-out/run"])
    captured = capsys.readouterr()
    assert exc.value.code == 2 and captured.out == "", captured.out  # nothing replayed
    assert captured.err.startswith("megha replay: error: --out: /proc/megha-out/run cannot be made: "), captured.err


def test_default_report_folder_that_cannot_be_made_is_refused_before_the_run(
    tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --out, the report goes under out/<command>/ in the working folder: a file `out` there is found before
    anything runs, not after the replay."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").write_text("")
    for command, folder in ((["replay", *SMALL], "out/replay"), (["local"], "out/local")):
        status, err = _run([*command, "--trace", str(trace)], capsys)
        assert status == 2, err
        assert f"{folder}, the report folder when --out is not given, cannot be made: out is a file" in err, err
    assert capsys.readouterr().out == ""  # nothing replayed


def test_out_is_not_left_behind_when_the_run_is_refused_for_another_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (["replay", *SMALL], ["local"]):
        status, err = _run(
            [*command, "--trace", str(tmp_path / "missing.tr"), "--out", str(tmp_path / "new/run")], capsys
        )
        assert status == 2 and "missing.tr" in err, err
        assert not (tmp_path / "new").exists(), command


def test_unreadable_trace_is_a_usage_error(
    trace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file this process may not open (as a user other than its owner; the tests run as root, who opens any file,
    so the refusal is made by hand)."""
    opened = Path.open

    def refused(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == trace:
            raise PermissionError(13, "Permission denied", str(self))
        return opened(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refused)
    status, err = _run(["replay", "--trace", str(trace), "--no-files", *SMALL], capsys)
    assert status == 2 and "--trace" in err and "Permission denied" in err, err


def test_fifo_cluster_is_refused_without_blocking(
    tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    status, err = _run(["replay", "--trace", str(trace), "--cluster", str(fifo), "--no-files", *SMALL], capsys)
    assert status == 2 and "--cluster" in err and "not a regular file" in err
    with pytest.raises(ClusterFileError, match="not a regular file"):
        load_cluster(fifo)


# 2. arrivals and durations after the time scale


@pytest.mark.parametrize(
    ("second", "scale", "field"),
    [("1e308 1 1 1", 10.0, "arrival_time"), ("1e300 1 1 1", 1.0, "arrival_time"), ("5 1 1 1e13", 1.0, "duration")],
)
def test_arrivals_and_durations_beyond_the_bound_are_refused_naming_the_line(
    tmp_path: Path, second: str, scale: float, field: str
) -> None:
    path = tmp_path / "big.tr"
    path.write_text(f"0 1 1 1\n{second}\n")
    with pytest.raises(TraceError, match=f"line 2: .*{field}"):
        read_trace(path, time_scale=scale)


def test_time_scale_overflow_is_a_usage_error_not_an_overflow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "big.tr"
    path.write_text("0 1 1 1\n1e308 1 1 1\n")
    status, err = _run(["replay", "--trace", str(path), "--time-scale", "10", "--no-files", *SMALL], capsys)
    assert status == 2 and "line 2" in err and "arrival_time" in err


def test_a_trace_within_the_bound_is_read(tmp_path: Path) -> None:
    path = tmp_path / "ok.tr"
    path.write_text(f"0 1 1 1\n{MAX_SECONDS:g} 1 1 {MAX_SECONDS:g}\n")
    assert read_trace(path)[1].arrival == MAX_SECONDS


def test_synthetic_trace_beyond_the_bound_is_refused() -> None:
    with pytest.raises(TraceError, match="syn:5:5"):
        resolve_trace("syn:5:5", time_scale=1e300)


# 4. cluster files


def test_deeply_nested_cluster_json_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ClusterFileError, match="nested too deeply"):
        load_cluster(path)


def test_duplicate_resource_names_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    node = {"capacity": {"a": 1}, "constraints": []}
    doc = {"format": "megha-cluster", "version": 1, "resource_names": ["a", "a"], "lms": [[[node]]]}
    path.write_text(json.dumps(doc))
    with pytest.raises(ClusterFileError, match="resource_names"):
        load_cluster(path)


# 5. trace numbers: ASCII only; a byte order mark is skipped


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("0 \uff11 1 1", "num_tasks"),
        ("0 1_0 1 1", "num_tasks"),
        ("0 1 1 \u0661", "task duration"),
        ("1_0 1 1 1", "arrival"),
    ],
)
def test_non_ascii_numbers_are_refused(tmp_path: Path, line: str, field: str) -> None:
    path = tmp_path / "odd.tr"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(TraceError, match=f"line 1: {field}"):
        read_trace(path)


def test_byte_order_mark_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "bom.tr"
    path.write_bytes(b"\xef\xbb\xbf0 1 1 1\n2 1 2 2\n")
    assert [job.arrival for job in read_trace(path)] == [0.0, 2.0]


@pytest.mark.parametrize(("spec", "field"), [("syn:\u00b2:5", "tasks_per_job"), ("syn:5:\u0661", "num_jobs")])
def test_synthetic_spec_names_its_field(spec: str, field: str) -> None:
    with pytest.raises(TraceError, match=field):
        resolve_trace(spec)


def test_a_synthetic_trace_too_big_to_hold_is_refused_before_any_is_made() -> None:
    with pytest.raises(TraceError, match=r"499,999,999,995 tasks is over the most a synthetic trace makes"):
        resolve_trace("syn:99999999999:5")
    with pytest.raises(TraceError, match="99,999,999,999 tasks"):
        resolve_trace("syn:99999999999:5", first_n=1)  # one job of them: still too many
    assert len(resolve_trace("syn:1000:100000")) == 100_000  # 10**8 tasks: the bound itself is made
    with pytest.raises(TraceError, match="100,001,000 tasks"):
        resolve_trace("syn:1000:100001")


# 3. node capacity bounded


@pytest.mark.parametrize("flag", ["--node-cpu", "--node-mem"])
def test_node_capacity_beyond_the_bound_is_a_usage_error(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, err = _run(["replay", flag, "9999999999999999999999", "--no-files", *SMALL], capsys)
    assert status == 2 and flag in err and "at most" in err


def test_node_capacity_bound_is_the_settings() -> None:
    from megha.common.settings import MAX_NODE_CAPACITY, WorkerSettings

    assert WorkerSettings(node_cpu_millicores=MAX_NODE_CAPACITY, node_memory_mb=64_000).node_memory_mb == 64_000
    with pytest.raises(ValueError, match="node_cpu_millicores"):
        WorkerSettings(node_cpu_millicores=MAX_NODE_CAPACITY + 1)


# 7. service URLs


@pytest.mark.parametrize(
    ("variable", "value", "service"),
    [
        ("MEGHA_LM_URLS", "not a url", "gm"),
        ("MEGHA_GM_URLS", "http://a:1,ftp://b", "gm"),
        ("MEGHA_LM_URL", "x", "worker"),
    ],
)
def test_bad_service_url_is_one_line_naming_the_variable(
    variable: str, value: str, service: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from megha.common.settings import GMSettings, WorkerSettings, load_settings

    monkeypatch.setenv("MEGHA_AUTH", "off")
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as exc:
        load_settings(GMSettings if service == "gm" else WorkerSettings, f"megha {service}")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and variable in err


# 6. crash rates bounded: no replay that never ends


@pytest.mark.parametrize(
    "spec", ["worker:rate=1e308", "worker:rate=1e9", "lm:rate=3601", "worker:at=1e300,lm=0,node=0"]
)
def test_fail_beyond_the_bounds_is_refused_at_once(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, err = _run(["replay", "--trace", "syn:5:5", "--fail", spec, "--no-files", *SMALL], capsys)
    assert status == 2 and "--fail" in err and "at most" in err


def test_fail_rates_of_one_kind_add_up_within_the_bound() -> None:
    from megha.embedded.faults import MAX_RATE, parse_faults

    faults = parse_faults([f"worker:rate={MAX_RATE / 2:g}"] * 2, 30.0, 60.0, 0)
    assert faults is not None and faults.worker_rate == MAX_RATE
    with pytest.raises(ValueError, match="add up"):
        parse_faults([f"worker:rate={MAX_RATE:g}", "worker:rate=1"], 30.0, 60.0, 0)


def test_replay_at_the_highest_crash_rate_ends(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["replay", "--trace", "syn:5:5", "--no-constraints", "--fail", "worker:rate=3600", "--no-files", *SMALL]
    assert cli.main(argv) in (0, 3)


# 11. credentials and API tokens


@pytest.mark.parametrize(("role", "ident"), [("gm", "x"), ("lm", "01"), ("gm", "+1"), ("lm", "\u0661")])
def test_credential_of_a_gm_or_lm_needs_its_number(
    role: str, ident: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MEGHA_CLUSTER_SECRET", "s" * 64)
    status, err = _run(["credential", role, ident], capsys)
    assert status == 2 and "IDENT" in err and "number" in err


def test_credential_of_a_gm_by_number_is_issued(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MEGHA_CLUSTER_SECRET", "s" * 64)
    assert cli.main(["credential", "gm", "1"]) == 0
    assert capsys.readouterr().out.startswith("megha-credential1.")


def test_api_token_given_both_ways_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "token"
    token.write_text("t\n")
    monkeypatch.setenv("MEGHA_API_TOKEN", "t")
    monkeypatch.setenv("MEGHA_API_TOKEN_FILE", str(token))
    status, err = _run(["job", "list", "--gm", "http://127.0.0.1:9"], capsys)
    assert status == 2 and "MEGHA_API_TOKEN and MEGHA_API_TOKEN_FILE are both set" in err
    with pytest.raises(ValueError, match="MEGHA_API_TOKEN and MEGHA_API_TOKEN_FILE are both set"):
        Client("http://127.0.0.1:9")  # the Python client refuses it too, as the CLI does


# 9. --overwrite leaves no stale report beside the new one


def test_overwrite_with_several_seeds_removes_the_single_replays_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from megha.loadgen.report import REPORT_FILES

    out = tmp_path / "out"
    argv = ["replay", "--trace", "syn:2:3", "--no-constraints", "--out", str(out), *SMALL]
    assert cli.main(argv) == 0
    (out / "notes.txt").write_text("mine")
    assert cli.main([*argv, "--seeds", "2", "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "seed-0", "seed-1", "seeds.json"]
    assert cli.main([*argv, "--overwrite"]) == 0
    assert not (out / "seeds.json").exists() and all((out / name).exists() for name in REPORT_FILES)
    capsys.readouterr()


# 8. megha local and megha chaos check their inputs before starting anything


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--nodes-per-worker", "2"], "--nodes-per-worker"),
        (["--queues", "a:50%:7", "--gms", "2"], "--queues"),
        (["--amqp-url", "amqp://nobody:sekrit@127.0.0.1:5/"], "--amqp-url"),
    ],
)
def test_local_refuses_bad_inputs_before_starting_a_service(
    args: list[str], named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from megha.deploy import local

    def start(self: local.LocalDeployment) -> None:
        raise AssertionError("a service was started")

    monkeypatch.setattr(local.LocalDeployment, "start", start)
    status, err = _run(["local", *args, "--out", str(tmp_path / "out")], capsys)
    assert status == 2 and named in err and "sekrit" not in err


def test_local_refuses_a_job_over_the_submission_limit_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "wide.tr"
    path.write_text("0 10001 1 " + " ".join(["1"] * 10_001) + "\n")
    status, err = _run(["local", "--trace", str(path), "--time-scale", "1", "--out", str(tmp_path / "out")], capsys)
    assert status == 2 and "--trace" in err and "10,001 tasks" in err


def test_broker_check_names_the_broker_without_its_password() -> None:
    from megha.deploy.local import BrokerUnreachable, check_broker

    with pytest.raises(BrokerUnreachable, match=re.escape("amqp://nobody@127.0.0.1:5/")) as exc:
        check_broker("amqp://nobody:sekrit@127.0.0.1:5/", timeout=2.0)
    assert "sekrit" not in str(exc.value)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--trace", "nonexist.tr"], "--trace"),
        (["--time-scale", "nan"], "--time-scale"),
        (["--out", "FILE"], "--out"),
    ],
)
def test_chaos_refuses_bad_inputs_before_starting_a_broker(
    args: list[str], named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from megha.deploy import chaos

    def trial(*_: object) -> None:
        raise AssertionError("a trial was started")

    monkeypatch.setattr(chaos, "run_trial", trial)
    file = tmp_path / "file"
    file.write_text("")
    argv = [str(file) if a == "FILE" else a for a in args]
    assert chaos.main(["--faults", "lm-kill", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err


@pytest.mark.skipif(not shutil.which("rabbitmq-server"), reason="needs rabbitmq-server for a private broker node")
def test_broker_check_says_a_login_was_refused_without_the_password() -> None:
    from megha.deploy.broker_node import broker_node
    from megha.deploy.local import BrokerUnreachable, check_broker

    with broker_node() as node:
        check_broker(node.url)
        with pytest.raises(BrokerUnreachable, match="ACCESS_REFUSED") as exc:
            check_broker(node.url.replace("guest:guest", "nobody:sekrit"))
    assert "sekrit" not in str(exc.value)


def test_cluster_file_capacity_beyond_the_bound_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "huge.json"
    node = {"capacity": {"cpu": 10**30}, "constraints": []}
    path.write_text(json.dumps({"format": "megha-cluster", "version": 1, "resource_names": ["cpu"], "lms": [[[node]]]}))
    with pytest.raises(ClusterFileError, match=r"capacity\.cpu"):
        load_cluster(path)


# 9. the argparse-based commands: a usage error is one line naming the option, exit status 2


@pytest.mark.parametrize(
    ("module", "argv", "named"),
    [
        ("megha.deploy.chaos", ["--trials", "x"], "--trials"),
        ("megha.deploy.secrets", ["--bogus", "/tmp/x"], "--bogus"),
        ("megha.sim.experiments.differences", ["--bogus"], "--bogus"),
        ("megha.sim.experiments.fairness", ["--bogus"], "--bogus"),
        ("megha.sim.experiments.failures", ["--bogus"], "--bogus"),
        ("megha.sim.experiments.priority", ["--bogus"], "--bogus"),
        ("megha.services.worker.burn", ["--cpu-millicores", "-1"], "--cpu-millicores"),
    ],
)
def test_an_argparse_command_s_usage_error_is_one_line(module: str, argv: list[str], named: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "--help" in lines[0], done.stderr


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("delta_interval", 1e-300, "--delta-interval 1e-300 must be between 0.001 and 1e+12 seconds"),
        ("delta_interval", 1e300, "--delta-interval 1e+300 must be between 0.001 and 1e+12 seconds"),
        ("hop_delay", 1e300, "--hop-delay 1e+300 must be between 0 and 1e+12 seconds"),
    ],
)
def test_a_replay_config_s_times_are_bounded(field: str, value: float, message: str) -> None:
    """The library's ReplayConfig refuses what the command line refuses: a delta interval of 1e-300 was a busy
    loop, a hop delay of 1e300 printed 300-digit figures and overflowed the utilization."""
    from megha.loadgen.replay import ReplayConfig, replay

    with pytest.raises(ValueError, match=re.escape(message)):
        replay(ReplayConfig(first_jobs=1, **{field: value}))


@pytest.mark.parametrize("kind", ["a link to nothing", "a name too long"])
def test_an_out_folder_that_cannot_be_made_says_why_naming_out(
    tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    out = tmp_path / "link"
    if kind == "a link to nothing":
        out.symlink_to(tmp_path / "nowhere")
        why = f"--out: {out} is a link to {tmp_path / 'nowhere'}, which does not exist"
    else:
        out = tmp_path / ("a" * 300)
        why = "cannot be made: File name too long"
    status, err = _run(["replay", *SMALL, "--trace", str(trace), "--out", str(out)], capsys)
    assert status == 2 and why in err and "\n" not in err.strip(), err
