"""Bad input to `megha job|queues|nodes|top` and megha.client, refused before any call in one line naming the option
or variable (exit status 2), never a traceback, a hang or a silent acceptance: a `--gm`/`--lm` URL with a bad port
or host, an API token an HTTP header cannot carry (never printed), a job file that is a FIFO, a job file giving a
key twice. No deployment: nothing is sent."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from clikit import run_cli

from megha.client import Client, JobFileError, read_job_file

MEGHA = str(Path(sys.executable).parent / "megha")
NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing answers (a call that is made fails with status 3)
CLEAN = ("MEGHA_GM_URL", "MEGHA_GM_URLS", "MEGHA_LM_URLS", "MEGHA_API_TOKEN", "MEGHA_API_TOKEN_FILE", "MEGHA_TLS_CA")


@pytest.fixture(autouse=True)
def _no_megha_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CLEAN:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["job", "submit", "--gm", "http://[::1", "--duration", "1"], "--gm: 'http://[::1'"),
        (["job", "list", "--gm", "http://[zz]:80"], "--gm: 'http://[zz]:80'"),
        (["nodes", "--gm", NOWHERE, "--lm", "http://127.0.0.1:abc"], "--lm: 'http://127.0.0.1:abc' has a bad port"),
        (["top", "--gm", "http://127.0.0.1:abc", "--iterations", "1"], "--gm: 'http://127.0.0.1:abc' has a bad port"),
        (["queues", "--gm", "http://127.0.0.1:99999"], "--gm: 'http://127.0.0.1:99999' has a bad port"),
        (["job", "list", "--gm", "http://a\x01b"], "--gm: 'http://a\\x01b' is not a URL"),
    ],
)
def test_a_bad_gm_or_lm_url_is_one_line_naming_the_option(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, err = run_cli(argv, capsys)
    assert status == 2 and err.startswith(f"megha: {named}"), err


def test_a_bad_url_from_a_variable_names_the_variable_and_the_client_refuses_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MEGHA_LM_URLS", "http://127.0.0.1:abc")
    status, err = run_cli(["nodes", "--gm", NOWHERE], capsys)
    assert status == 2 and err.startswith("megha: MEGHA_LM_URLS: 'http://127.0.0.1:abc' has a bad port"), err
    with pytest.raises(ValueError, match=r"'http://\[::1' is not a URL"):
        Client("http://[::1")


SECRET = "XYZZY"  # a part of each bad token, which no message may hold


@pytest.mark.parametrize("token", [f"{SECRET}\u00e9", f"{SECRET}\n{SECRET}", f"{SECRET} {SECRET}"])
def test_a_token_an_http_header_cannot_carry_is_refused_naming_it_without_printing_it(
    token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    submit = ["job", "submit", "--gm", NOWHERE, "--duration", "1"]
    status, err = run_cli([*submit, "--token", token], capsys)
    assert status == 2 and "--token: an API token holds visible ASCII characters only" in err, err
    assert SECRET not in err
    monkeypatch.setenv("MEGHA_API_TOKEN", token)
    status, err = run_cli(submit, capsys)
    assert status == 2 and "MEGHA_API_TOKEN: an API token holds visible ASCII" in err and SECRET not in err, err
    monkeypatch.delenv("MEGHA_API_TOKEN")
    secret = tmp_path / "token"
    secret.write_text(token + "\n")  # the file's end of line is not the token's
    monkeypatch.setenv("MEGHA_API_TOKEN_FILE", str(secret))
    status, err = run_cli(submit, capsys)
    assert status == 2 and "MEGHA_API_TOKEN_FILE: an API token holds visible ASCII" in err and SECRET not in err, err
    monkeypatch.delenv("MEGHA_API_TOKEN_FILE")
    with pytest.raises(ValueError, match="token: an API token holds visible ASCII") as info:
        Client(NOWHERE, token=token)
    assert SECRET not in str(info.value)


def test_a_visible_ascii_token_from_a_file_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "token"
    secret.write_text("alice-token-~!#$%&'*+/=?^_`{|}\n")
    monkeypatch.setenv("MEGHA_API_TOKEN_FILE", str(secret))
    status, err = run_cli(["job", "list", "--gm", NOWHERE], capsys)
    assert status == 3 and "cannot be reached" in err, err  # accepted: the call was made


def test_a_token_file_that_is_a_fifo_is_refused_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reading a FIFO would wait for a writer for ever (a service's MEGHA_*_FILE: tests/test_startup_errors.py)."""
    fifo = tmp_path / "token"
    os.mkfifo(fifo)
    monkeypatch.setenv("MEGHA_API_TOKEN_FILE", str(fifo))
    status, err = run_cli(["job", "list", "--gm", NOWHERE], capsys)
    assert status == 2 and "MEGHA_API_TOKEN_FILE: cannot read" in err and "not a regular file" in err, err


def test_a_job_file_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    run = subprocess.run(
        [MEGHA, "job", "submit", "--gm", NOWHERE, str(fifo)], capture_output=True, text=True, timeout=30, env=env
    )
    assert run.returncode == 2, run
    assert run.stderr == f"megha: {fifo}: not a regular file (a job file is read from a file, or - for stdin)\n"
    piped = subprocess.run(  # `-` still reads stdin, a pipe
        [MEGHA, "job", "submit", "--gm", NOWHERE, "-"],
        input="tasks:\n  - {duration: 1, cpu_millicores: 0}\n",
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert piped.returncode == 2 and piped.stderr.startswith("megha: -: tasks.0.cpu_millicores: "), piped


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "job.yaml",
            "user: alice\nuser: bob\ntasks: [{duration: 1}]\n",
            "key 'user' given twice in one mapping (lines 1, 2)",
        ),
        (
            "job.yaml",
            "tasks:\n  - duration: 1\n    cpu_millicores: 100\n    duration: 9\n",
            "key 'duration' given twice in one mapping (lines 2, 4)",
        ),
        (
            "job.yaml",
            '{"user": "alice", "user": "bob", "tasks": []}',
            "key 'user' given twice in one mapping (lines 1, 1)",
        ),
        ("job.json", '{"user": "alice", "tasks": [], "user": "bob"}', "key 'user' given twice in one object"),
        ("job.json", '{"tasks": [{"duration": 1, "duration": 2}]}', "key 'duration' given twice in one object"),
    ],
)
def test_a_job_file_giving_a_key_twice_is_refused_naming_the_key(
    name: str, text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / name
    path.write_text(text)
    status, err = run_cli(["job", "submit", "--gm", NOWHERE, str(path)], capsys)
    assert status == 2 and err == f"megha: {path}: {message}", err


def test_a_job_file_from_stdin_and_a_merge_key_are_still_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("user: alice\ntasks: [{duration: 1}]\n"))
    assert read_job_file("-") == {"user": "alice", "tasks": [{"duration": 1}]}
    merged = tmp_path / "job.yaml"  # a merge key's keys may be given again: the mapping's own win (YAML's rule)
    merged.write_text("tasks:\n  - <<: {duration: 1, memory_mb: 64}\n    duration: 2\n")
    assert read_job_file(merged) == {"tasks": [{"duration": 2, "memory_mb": 64}]}
    monkeypatch.setattr(sys, "stdin", io.StringIO("user: alice\nuser: bob\n"))
    with pytest.raises(JobFileError, match="-: key 'user' given twice"):
        read_job_file("-")


def test_a_key_given_twice_is_found_in_one_pass_over_a_large_object() -> None:
    """A user's 4 MB body of one object with many distinct keys, then one key half a million times: the repeat and
    its path are found (by sets, in one pass: counting each key's repeats took seconds on the GM's event loop)."""
    from megha.common.jsonkeys import KeyTwiceError, key_twice, unique_keys

    env = ",".join([f'"A{i}":"x"' for i in range(127)] + ['"B":"x"'] * 500_000)
    body = '{"tasks":[{"command":["true"],"env":{' + env + "}}]}"
    assert key_twice(body.encode()) == ("tasks", 0, "env", "B")
    with pytest.raises(KeyTwiceError, match="'B' given twice"):
        unique_keys([(f"A{i}", 1) for i in range(127)] + [("B", 1)] * 500_000)
