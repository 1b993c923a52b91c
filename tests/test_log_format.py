"""One log format for Megha and uvicorn: text by default, one JSON object a line with MEGHA_LOG_FORMAT=json."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from megha.common.auth import new_secret
from megha.common.transport.rabbit import Broker, lm_key
from megha.deploy.local import free_port

from servicekit import AMQP, needs_rabbitmq, wait_until

JSON_KEYS = {"time", "level", "logger", "service", "message"}
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} lm-0 (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.-]+: ")


def _env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGHA_")}
    return env | values


class _LM:
    """A real LM process (no agents: it serves HTTP while it waits for them) whose output goes to a file."""

    def __init__(self, log: Path, log_format: str) -> None:
        self.port, self.run_id, self.log = free_port(), f"logfmt-{uuid.uuid4().hex[:8]}", log
        env = _env(
            MEGHA_AMQP_URL=AMQP,
            MEGHA_RUN_ID=self.run_id,
            MEGHA_PORT=str(self.port),
            MEGHA_LOG_LEVEL="debug",  # uvicorn's access log too
            MEGHA_LOG_FORMAT=log_format,
            MEGHA_CLUSTER_SECRET=new_secret(),  # authentication on, as deployed
        )
        with log.open("wb") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "megha.services.lm"], env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def text(self) -> str:
        return self.log.read_text()

    def get_healthz(self) -> None:
        def answers() -> bool:
            assert self.popen.poll() is None, self.text()
            try:
                return httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(answers, 60, self.text)

    def stop(self) -> str:
        """SIGTERM, wait for the exit, remove the run's queues; the whole output."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        asyncio.run(self._delete_run())
        return self.text()

    async def _delete_run(self) -> None:
        broker = Broker(AMQP, self.run_id, connect_timeout=3.0)
        await broker.connect()
        try:
            await broker.delete_run([lm_key(0)])
        finally:
            await broker.close(flush_timeout=0.5)


@pytest.fixture
def lm_output(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The output of an LM in the format `request.param` that started, answered GET /healthz once, and stopped."""
    lm = _LM(tmp_path / "lm.log", request.param)
    try:
        lm.get_healthz()
        wait_until(lambda: "GET /healthz" in lm.text(), 10, lm.text)  # the access log line
    finally:
        output = lm.stop()
    yield output


def _uvicorn_lines(lines: list[str]) -> dict[str, str]:
    """The line of each uvicorn message the test looks for."""
    wanted = ("Started server process", "Application startup complete", "Uvicorn running on", "GET /healthz")
    found = {w: line for w in wanted for line in lines if w in line}
    assert set(found) == set(wanted), lines
    return found


@needs_rabbitmq
@pytest.mark.parametrize("lm_output", ["json"], indirect=True)
def test_every_line_of_a_service_is_a_json_object_uvicorn_s_included(lm_output: str) -> None:
    lines = lm_output.splitlines()
    entries = []
    for line in lines:
        entry = json.loads(line)  # fails on any line that is not JSON
        assert isinstance(entry, dict) and entry.keys() >= JSON_KEYS, line
        assert entry["service"] == "lm-0", line
        assert ISO_UTC.match(entry["time"]) and datetime.fromisoformat(entry["time"]), line
        entries.append(entry)
    loggers = {e["logger"] for e in entries}
    assert {"lm-0", "uvicorn.error", "uvicorn.access"} <= loggers, loggers
    access = json.loads(_uvicorn_lines(lines)["GET /healthz"])
    assert access["logger"] == "uvicorn.access" and access["level"] == "INFO"
    assert not any("color_message" in e for e in entries)  # uvicorn's coloured copy of the message stays out
    # Given the root secret instead of its own credential, the service says once that it holds the root.
    root = [e for e in entries if "holds the deployment's root secret" in e["message"]]
    assert len(root) == 1 and root[0]["level"] == "WARNING", root


@needs_rabbitmq
@pytest.mark.parametrize("lm_output", ["text"], indirect=True)
def test_uvicorn_s_text_lines_carry_megha_s_prefix(lm_output: str) -> None:
    lines = lm_output.splitlines()
    for line in lines:
        assert TEXT_LINE.match(line), line
    for what, line in _uvicorn_lines(lines).items():
        logger = "uvicorn.access" if what == "GET /healthz" else "uvicorn.error"
        assert f" lm-0 INFO {logger}: " in line, line
    assert any(" lm-0 INFO lm-0: LM 0 serving on " in line for line in lines), lines


@pytest.mark.parametrize(
    "module", ["megha.services.gm", "megha.services.lm", "megha.services.worker", "megha.loadgen.services"]
)
def test_a_bad_log_format_is_one_line_naming_the_variable(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module],
        env=_env(MEGHA_LOG_FORMAT="yaml", MEGHA_PORT=str(free_port())),
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert len(output.strip().splitlines()) == 1 and "Traceback" not in output, output
    assert "bad settings" in output and "MEGHA_LOG_FORMAT" in output, output


LOGGING_SCRIPT = """
import logging, warnings
from megha.services.logs import configure_logging

log = configure_logging("info", "loadgen", {log_format!r})
log.info("task %s placed", "t-1", extra={{"job_id": "j-1", "lm": 2, "node": 17}})
try:
    1 / 0
except ZeroDivisionError:
    log.exception("step failed\\nsecond line")
warnings.warn("old option")
logging.getLogger("uvicorn.error").info("Started", extra={{"color_message": "\\x1b[1mStarted\\x1b[0m"}})
"""


def _log_lines(log_format: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", LOGGING_SCRIPT.format(log_format=log_format)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr.splitlines()


def test_json_lines_carry_extra_ids_and_the_traceback_as_one_string() -> None:
    lines = _log_lines("json")
    entries = [json.loads(line) for line in lines]  # the traceback and the message's newline stay inside one line
    assert len(entries) == 4, lines
    placed, failed, warned, started = entries
    assert placed["message"] == "task t-1 placed" and placed["service"] == "loadgen" and placed["logger"] == "loadgen"
    assert (placed["job_id"], placed["lm"], placed["node"]) == ("j-1", 2, 17)
    assert failed["level"] == "ERROR" and failed["message"] == "step failed\nsecond line"
    assert failed["exc_info"].startswith("Traceback") and "ZeroDivisionError" in failed["exc_info"]
    assert warned["logger"] == "py.warnings" and "old option" in warned["message"]
    assert started == {k: started[k] for k in JSON_KEYS}  # uvicorn's color_message is not an extra field


def test_text_lines_keep_the_format_and_add_extra_ids() -> None:
    lines = _log_lines("text")
    assert re.match(r"^\S+ \S+ loadgen INFO loadgen: task t-1 placed job_id=j-1 lm=2 node=17$", lines[0]), lines
    # A message's own line break is escaped (one line a message: what users wrote cannot forge one); the traceback
    # follows on lines of its own.
    assert " loadgen ERROR loadgen: step failed\\nsecond line" in lines[1] and lines[2].startswith("Traceback"), lines
    assert re.match(r"^\S+ \S+ loadgen INFO uvicorn.error: Started$", lines[-1]), lines


def test_a_text_line_quoting_what_a_user_wrote_stays_one_line_without_terminal_controls() -> None:
    """A task's stderr tail quoted as its failure reason (or a job's name) cannot forge a log line of its own, nor
    send an escape sequence to the terminal of whoever reads the log; a traceback still follows its line."""
    import logging

    from megha.services.logs import TextFormatter

    forged = "boom\n2026-12-01 04:00:00,000 lm-0 WARNING megha.lm: forged\r\x1b]52;c;cGF5bG9hZA==\x07\u2028tab\tkept"
    record = logging.makeLogRecord({"name": "megha.lm", "levelno": 30, "levelname": "WARNING", "msg": forged})
    record.__dict__["user"] = "alice\nforged"
    try:
        raise RuntimeError("the traceback")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    first, *traceback = TextFormatter("lm-0").format(record).splitlines()
    assert "\\n2026-12-01 04:00:00,000 lm-0 WARNING megha.lm: forged\\r\\x1b]52;" in first, first
    assert "\\x07\\u2028tab\tkept user=alice\\nforged" in first, first
    assert traceback[0] == "Traceback (most recent call last):" and traceback[-1] == "RuntimeError: the traceback"


def test_aio_pika_s_closed_channel_error_on_a_lost_broker_connection_is_dropped_and_other_errors_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On every loss of the broker connection aio-pika logged an ERROR from a channel's close callback beside the
    service's own reconnection warning; an operator read two faults. That one line is dropped, no other."""
    import logging

    from megha.services.logs import configure_logging

    configure_logging("info", "lm-0")
    tools = logging.getLogger("aio_pika.tools")
    with caplog.at_level(logging.INFO):
        tools.error(
            "Callback %r error: %s",
            "<OneShotCallback: cb=<bound method RobustChannel._on_close of <RobustChannel>>>",
            "ChannelInvalidStateError: No active transport in channel",
        )
        tools.error("Callback %r error: %s", "<OneShotCallback: cb=<function on_message>>", "KeyError: 'x'")
    assert [r.getMessage() for r in caplog.records if r.name == "aio_pika.tools"] == [
        "Callback '<OneShotCallback: cb=<function on_message>>' error: KeyError: 'x'"
    ]
