"""A service that cannot start says why in one line and exits with status 2: no traceback, no hang."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from megha.common.settings import GMSettings
from megha.deploy.local import free_port

from servicekit import needs_rabbitmq, wait_until


def _start(module: str, **env: str) -> subprocess.CompletedProcess[str]:
    values = dict(os.environ) | {"MEGHA_PORT": str(free_port())} | env
    return subprocess.run([sys.executable, "-m", module], env=values, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("module", ["megha.services.lm", "megha.services.worker", "megha.services.gm"])
def test_no_broker_at_the_configured_url_is_one_clear_line(module: str) -> None:
    nowhere = f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    done = _start(
        module,
        MEGHA_AMQP_URL=nowhere,
        MEGHA_BROKER_TIMEOUT="2",
        MEGHA_LM_URLS="http://127.0.0.1:9",
        MEGHA_LM_URL="http://127.0.0.1:9",
        MEGHA_LM_TIMEOUT="2",
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if " ERROR " in line or line.startswith("ERROR")]
    assert len(errors) == 1, output
    # The GM first waits for its LMs; the LM and the agent first connect to the broker.
    wanted = "LM 0 at http://127.0.0.1:9 not ready" if module.endswith("gm") else "RabbitMQ unreachable at amqp"
    assert "cannot start: " in errors[0] and (wanted in errors[0] or "unreachable" in errors[0]), errors[0]


@pytest.mark.parametrize(
    ("module", "env", "named"),
    [
        ("megha.services.gm", {"MEGHA_TAKEOVER_AFTER": "-1"}, "MEGHA_TAKEOVER_AFTER"),
        ("megha.services.gm", {"MEGHA_GM_ID": "3", "MEGHA_GM_URLS": "http://a:1,http://b:1"}, "MEGHA_GM_URLS"),
        ("megha.services.lm", {"MEGHA_NUM_GMS": "zero"}, "MEGHA_NUM_GMS"),
        ("megha.services.worker", {"MEGHA_PORT": "99999"}, "MEGHA_PORT"),
        ("megha.loadgen.services", {"MEGHA_TIME_SCALE": "fast"}, "MEGHA_TIME_SCALE"),
        # The broker URL is checked before any connection: one without a host made aio-pika retry without end,
        # deaf to SIGTERM; another scheme was taken for amqp://; a port beyond 65535 was a traceback.
        ("megha.services.gm", {"MEGHA_AMQP_URL": ""}, "MEGHA_AMQP_URL"),
        ("megha.services.lm", {"MEGHA_AMQP_URL": "http://127.0.0.1:5672/"}, "MEGHA_AMQP_URL"),
        ("megha.services.worker", {"MEGHA_AMQP_URL": "amqp://guest:guest@127.0.0.1:99999/"}, "MEGHA_AMQP_URL"),
        ("megha.loadgen.services", {"MEGHA_AMQP_URL": "nonsense"}, "MEGHA_AMQP_URL"),
        # Seconds are finite: inf waited for the broker or an LM for ever.
        ("megha.services.lm", {"MEGHA_BROKER_TIMEOUT": "inf"}, "MEGHA_BROKER_TIMEOUT"),
        ("megha.services.gm", {"MEGHA_LM_TIMEOUT": "inf"}, "MEGHA_LM_TIMEOUT"),
        ("megha.loadgen.services", {"MEGHA_TIMEOUT": "inf"}, "MEGHA_TIMEOUT"),
        ("megha.loadgen.services", {"MEGHA_GM_TIMEOUT": "inf"}, "MEGHA_GM_TIMEOUT"),
        ("megha.loadgen.services", {"MEGHA_GM_TIMEOUT": "nan"}, "MEGHA_GM_TIMEOUT"),
        ("megha.loadgen.services", {"MEGHA_GM_TIMEOUT": "0"}, "MEGHA_GM_TIMEOUT"),
        # An interval between repeated actions is at least MIN_INTERVAL: 1e-300 was a busy loop.
        ("megha.services.gm", {"MEGHA_DEPENDENCY_POLL": "1e-300"}, "MEGHA_DEPENDENCY_POLL"),
        ("megha.services.lm", {"MEGHA_DELTA_INTERVAL": "1e-300"}, "MEGHA_DELTA_INTERVAL"),
        ("megha.services.lm", {"MEGHA_WORKER_TIMEOUT": "1e-300"}, "MEGHA_WORKER_TIMEOUT"),
        ("megha.services.worker", {"MEGHA_HEARTBEAT_INTERVAL": "1e-300"}, "MEGHA_HEARTBEAT_INTERVAL"),
        ("megha.services.gm", {"MEGHA_LM_URLS": ","}, "MEGHA_LM_URLS"),
        ("megha.services.gm", {"MEGHA_LM_URLS": '["http://lm-0:8100", 7]'}, "MEGHA_LM_URLS"),
        ("megha.loadgen.services", {"MEGHA_GM_URLS": ""}, "MEGHA_GM_URLS"),
        ("megha.services.gm", {"MEGHA_PUBLIC_URL": "ftp://gm-0"}, "MEGHA_PUBLIC_URL"),
        ("megha.services.gm", {"MEGHA_QUEUES": "q1:100%:0", "MEGHA_QUEUE_ORDER": "priority"}, "MEGHA_QUEUE_ORDER"),
        ("megha.services.lm", {"MEGHA_QUEUES": "q1:50%:0,q2:50%:3"}, "MEGHA_QUEUES"),
        ("megha.loadgen.services", {"MEGHA_QUEUES": "q1:50%:0,q2:50%:3"}, "MEGHA_QUEUES"),
        ("megha.services.lm", {"MEGHA_EXPECTED_NODES": "1000000000000"}, "MEGHA_EXPECTED_NODES"),
        ("megha.services.worker", {"MEGHA_NODES": "1000000000000"}, "MEGHA_NODES"),
        ("megha.services.worker", {"MEGHA_NODES": "3"}, "MEGHA_NODES"),  # a real agent is one node
        ("megha.services.lm", {"MEGHA_NUM_GMS": str(10**30)}, "MEGHA_NUM_GMS"),  # was an OverflowError
        # Finite but endless: 1e30 s waited for ever, as inf did.
        ("megha.services.lm", {"MEGHA_BROKER_TIMEOUT": "1e30"}, "MEGHA_BROKER_TIMEOUT"),
        ("megha.services.gm", {"MEGHA_HTTP_TIMEOUT": "1e308"}, "MEGHA_HTTP_TIMEOUT"),
        ("megha.services.worker", {"MEGHA_HEARTBEAT_INTERVAL": "1e308"}, "MEGHA_HEARTBEAT_INTERVAL"),
        ("megha.loadgen.services", {"MEGHA_TIMEOUT": "1e308"}, "MEGHA_TIMEOUT"),
        # A host to bind that is no address nor host name, and a blank journal folder (made as a folder " ").
        ("megha.services.gm", {"MEGHA_HOST": "999.1.1.1"}, "MEGHA_HOST"),
        ("megha.services.lm", {"MEGHA_HOST": " "}, "MEGHA_HOST"),
        ("megha.services.gm", {"MEGHA_JOURNAL_DIR": " "}, "MEGHA_JOURNAL_DIR"),
        # The load generator's trace: these were tracebacks.
        ("megha.loadgen.services", {"MEGHA_TRACE": "/no/such/trace.tr"}, "MEGHA_TRACE"),
        ("megha.loadgen.services", {"MEGHA_TRACE": "syn:a:b"}, "MEGHA_TRACE"),
        ("megha.loadgen.services", {"MEGHA_TIME_SCALE": "1e308"}, "MEGHA_TRACE"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_variable(module: str, env: dict[str, str], named: str) -> None:
    done = _start(module, **{"MEGHA_AUTH": "off", **env})
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1, output
    assert "bad settings" in output and named in output, output


@pytest.mark.parametrize(
    ("module", "env", "said"),
    [
        ("megha.services.worker", {"MEGHA_CONSTRAINTS": "1,1"}, "MEGHA_CONSTRAINTS: constraint ids [1] listed twice"),
        ("megha.services.worker", {"MEGHA_CONSTRAINTS": "3,1,3,2"}, "MEGHA_CONSTRAINTS: constraint ids [3] listed"),
        (
            "megha.services.gm",
            {"MEGHA_PRIORITY_CLASS_USERS": "high:alice+bob+alice"},
            "MEGHA_PRIORITY_CLASS_USERS: user 'alice' listed twice for class 'high'",
        ),
        (
            "megha.services.gm",
            {"MEGHA_PRIORITY_CLASS_USERS": "high:alice+bob,high:bob"},
            "MEGHA_PRIORITY_CLASS_USERS: user 'bob' listed twice for class 'high'",
        ),
    ],
    ids=["constraint", "constraint-apart", "class-user", "class-user-in-two-items"],
)
def test_a_setting_that_lists_a_value_twice_is_one_line_naming_it(module: str, env: dict[str, str], said: str) -> None:
    """A repeat means nothing (a node has a constraint or not; a user may name a class or not) and may hide a typo
    in the other copy, so the service does not start."""
    done = _start(module, MEGHA_AUTH="off", **env)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1, output
    assert "bad settings" in output and said in output, output


def test_one_user_may_be_listed_for_two_classes() -> None:
    """Not a repeat: a class allows only the users listed for it, so a user who may name two classes is listed
    for each."""
    settings = GMSettings(
        auth="off", priority_classes="low:0,normal:100,high:1000,urgent:2000", priority_class_users="high:a,urgent:a"
    )
    assert settings.class_users() == {"high": frozenset({"a"}), "urgent": frozenset({"a"})}


@pytest.mark.parametrize("module", ["megha.services.gm", "megha.services.lm", "megha.services.worker"])
def test_a_port_already_taken_is_one_line_before_the_service_starts(module: str) -> None:
    """uvicorn binds only after the service's start-up (a GM's wait for its LMs included), and then said so in
    several lines that named no setting; the service now binds first."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = _start(module, MEGHA_AUTH="off", MEGHA_PORT=str(port), MEGHA_LM_URLS="http://127.0.0.1:9")
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert len(output.strip().splitlines()) == 1 and "Traceback" not in output, output
    assert f"MEGHA_HOST=127.0.0.1, MEGHA_PORT={port}: cannot listen there: Address already in use" in output, output


@needs_rabbitmq
@pytest.mark.parametrize(
    ("lm_gms", "gm_id", "said"),
    [
        # A GM whose MEGHA_GM_ID the LMs have no partition for (their MEGHA_NUM_GMS): a traceback from uvicorn's
        # start-up ("GM id 5 outside 0..0").
        ([1], "5", ["MEGHA_GM_ID=5", "MEGHA_NUM_GMS=1"]),
        # LMs started with different MEGHA_NUM_GMS (an outside audit: a traceback ending in "LM 1 has 2 partitions;
        # every LM needs exactly 1 (one per GM)").
        ([1, 2], "0", ["do not fit together: LM 1 has 2 partitions", "the same MEGHA_NUM_GMS"]),
    ],
)
def test_a_gm_the_lms_partitions_do_not_fit_is_one_line_naming_the_settings(
    lm_gms: list[int], gm_id: str, said: list[str]
) -> None:
    base = dict(os.environ) | {"MEGHA_AUTH": "off", "MEGHA_RUN_ID": f"gmid{free_port()}"}
    lm_urls, services = [], []
    for lm, gms in enumerate(lm_gms):
        lm_port, agent_port = free_port(), free_port()
        lm_url = f"http://127.0.0.1:{lm_port}"
        lm_urls.append(lm_url)
        nodes = {"MEGHA_EXPECTED_NODES": str(gms)}
        lm_env = {"MEGHA_PORT": str(lm_port), "MEGHA_NUM_GMS": str(gms), "MEGHA_LM_ID": str(lm), **nodes}
        agent_env = {"MEGHA_PORT": str(agent_port), "MEGHA_LM_URL": lm_url, "MEGHA_EXECUTION": "simulated"}
        agent_env |= {"MEGHA_NODES": str(gms), "MEGHA_WORKER_ID": f"w{lm}"}
        for module, env in (("megha.services.lm", lm_env), ("megha.services.worker", agent_env)):
            services.append(
                subprocess.Popen(
                    [sys.executable, "-m", module],
                    env=base | env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
    try:
        done = _start(
            "megha.services.gm",
            **base,
            MEGHA_LM_URLS=",".join(lm_urls),
            MEGHA_GM_ID=gm_id,
            MEGHA_JOURNAL_DIR="",
            MEGHA_LM_TIMEOUT="30",
        )
    finally:
        for proc in services:
            proc.terminate()
            proc.wait(timeout=30)
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in output, output
    errors = [line for line in output.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and all(words in errors[0] for words in said), output


def test_a_secret_file_that_is_a_fifo_is_one_line_not_a_hang(tmp_path: Path) -> None:
    """MEGHA_<NAME>_FILE naming a FIFO: its read waited for a writer for ever."""
    fifo = tmp_path / "credential"
    os.mkfifo(fifo)
    done = _start("megha.services.lm", MEGHA_AUTH="off", MEGHA_CREDENTIAL_FILE=str(fifo))
    output = done.stdout + done.stderr
    assert done.returncode == 2 and len(output.strip().splitlines()) == 1, output
    assert "MEGHA_CREDENTIAL_FILE: cannot read" in output and "not a regular file" in output, output


def test_the_wait_for_the_broker_gives_its_seconds_readably(caplog: pytest.LogCaptureFixture) -> None:
    """MEGHA_BROKER_TIMEOUT=1e308 was logged as a number of 309 digits, and 0.5 as 0."""
    from megha.common.transport.rabbit import Broker, BrokerUnavailable

    nowhere = f"amqp://guest:guest@127.0.0.1:{free_port()}/"

    async def wait_a_while() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(Broker(nowhere, "megha", connect_timeout=1e308).connect(), 2)

    with caplog.at_level(logging.WARNING):
        asyncio.run(wait_a_while())
    assert "giving up in 1e+308 s" in caplog.text, caplog.text
    with pytest.raises(BrokerUnavailable, match=r"unreachable at .* for 0\.5 s \("):
        asyncio.run(Broker(nowhere, "megha", connect_timeout=0.5).connect())


def test_url_lists_are_read_as_json_lists_too_as_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    from megha.common.settings import GMSettings, LoadgenSettings

    monkeypatch.setenv("MEGHA_AUTH", "off")
    monkeypatch.setenv("MEGHA_LM_URLS", '["http://lm-0:8100", "http://lm-1:8100"]')
    monkeypatch.setenv("MEGHA_GM_URLS", '["http://gm-0:8000"]')
    assert GMSettings().lm_urls == ["http://lm-0:8100", "http://lm-1:8100"]
    assert GMSettings().gm_urls == LoadgenSettings().gm_urls == ["http://gm-0:8000"]


def test_a_load_generator_no_gm_answers_says_so_in_one_line_before_submitting(tmp_path: Path) -> None:
    """It asks for MEGHA_GM_TIMEOUT seconds, saying at each round which GM it waits for, then exits in one line."""
    done = _start(
        "megha.loadgen.services",
        MEGHA_AUTH="off",
        MEGHA_GM_URLS=f"http://127.0.0.1:{free_port()}",
        MEGHA_GM_TIMEOUT="3",
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in output, output
    assert output.count("no GM of MEGHA_GM_URLS answered") == 1 and "submitting" not in output, output
    assert "(asked for 3 s: MEGHA_GM_TIMEOUT)" in output, output
    assert output.count("waiting for a GM of MEGHA_GM_URLS to answer (giving up in ") >= 1, output


def test_a_load_generator_started_before_its_gm_waits_for_it() -> None:
    """In a deployment the generator may start first (a swarm has no start order; the GMs' names do not even resolve
    until their containers are healthy): it waits for a GM to answer GET /v1/state, then goes on (here to a broker
    that is not there, which ends it: past the GMs)."""
    port = free_port()
    env = dict(os.environ) | {
        "MEGHA_AUTH": "off",
        "MEGHA_GM_URLS": f"http://127.0.0.1:{port}",
        "MEGHA_GM_TIMEOUT": "60",
    }
    env |= {"MEGHA_AMQP_URL": f"amqp://guest:guest@127.0.0.1:{free_port()}/", "MEGHA_BROKER_TIMEOUT": "1"}
    loadgen = subprocess.Popen(
        [sys.executable, "-m", "megha.loadgen.services"], env=env, stderr=subprocess.PIPE, text=True
    )
    assert loadgen.stderr is not None
    said = []
    try:
        for line in loadgen.stderr:
            said.append(line)
            if "waiting for a GM of MEGHA_GM_URLS to answer" in line:
                break
        with _gm_state_server(port):
            said.append(loadgen.communicate(timeout=60)[1])
    finally:
        loadgen.kill()
        loadgen.wait()
    output = "".join(said)
    assert loadgen.returncode == 2 and "Traceback" not in output, output
    assert "no GM of MEGHA_GM_URLS" not in output and "RabbitMQ unreachable" in output, output


@contextlib.contextmanager
def _gm_state_server(port: int) -> Iterator[None]:
    """A stand-in GM on `port` that answers GET /v1/state (a data centre of one 2-core node)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from megha.common.wire.answers import GMState

    counts = dict.fromkeys(("gm", "queued", "waiting", "running", "repartitions", "inconsistencies"), 0)
    counts |= dict.fromkeys(("reschedules", "preemption_attempts", "preemptions", "preempted", "retries"), 0)
    counts |= dict.fromkeys(("cancelled", "unfinished_tasks", "finished_jobs_dropped", "ignored_broker_messages"), 0)
    body = GMState(**counts, total_capacity=[2000, 4096], partitions=[], lm_urls=[]).model_dump_json().encode()

    class State(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/v1/state" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), State)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def test_a_load_generator_s_report_folder_that_cannot_be_made_is_refused_before_the_replay(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    done = _start("megha.loadgen.services", MEGHA_AUTH="off", MEGHA_OUT=str(tmp_path / "a-file" / "out"))
    output = done.stdout + done.stderr
    assert done.returncode == 2 and len(output.strip().splitlines()) == 1, output
    assert "bad settings: MEGHA_OUT=" in output, output


def test_an_agent_says_which_lm_it_waits_for_while_it_waits() -> None:
    """The agent connects to the broker (the test run's), then registers with an LM that never answers: it says so
    within seconds, as the GM does, rather than after its two minutes of silence."""
    env = dict(os.environ) | {"MEGHA_PORT": str(free_port()), "MEGHA_LM_URL": "http://127.0.0.1:9"}
    env |= {"MEGHA_EXECUTION": "simulated", "MEGHA_LOG_FORMAT": "text"}
    agent = subprocess.Popen(
        [sys.executable, "-m", "megha.services.worker"], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL
    )
    assert agent.stderr is not None
    os.set_blocking(agent.stderr.fileno(), False)
    said = bytearray()

    def heard() -> bool:
        said.extend(agent.stderr.read() or b"")  # type: ignore[union-attr]
        return b"waiting for LM at http://127.0.0.1:9" in said

    try:
        wait_until(heard, 30, saw=lambda: said.decode())
    finally:
        agent.terminate()
        agent.wait(10)
        agent.stderr.close()
    assert b"Traceback" not in said


@pytest.mark.parametrize("role", ["gm", "lm", "worker", "loadgen"])
def test_a_bad_setting_names_the_command_it_was_given_to(role: str) -> None:
    values = dict(os.environ) | {"MEGHA_PORT": "99999", "MEGHA_TIME_SCALE": "fast"}
    done = subprocess.run(
        [sys.executable, "-m", "megha.cli", role], env=values, capture_output=True, text=True, timeout=60
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2 and len(output.strip().splitlines()) == 1, output
    assert output.startswith(f"megha {role}: bad settings: "), output


def test_a_gm_says_which_lm_it_waits_for_while_it_waits() -> None:
    done = _start("megha.services.gm", MEGHA_LM_URLS="http://127.0.0.1:9", MEGHA_LM_TIMEOUT="7")
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in output
    assert "waiting for LM 0 at http://127.0.0.1:9" in output


@pytest.mark.parametrize("role", ["gm", "lm", "worker", "loadgen"])
def test_help_lists_every_setting_with_its_variable_and_default(role: str) -> None:
    from megha.common.settings import GMSettings, LMSettings, LoadgenSettings, WorkerSettings

    model = {"gm": GMSettings, "lm": LMSettings, "worker": WorkerSettings, "loadgen": LoadgenSettings}[role]
    done = subprocess.run(
        [sys.executable, "-m", "megha.cli", role, "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    for name in model.model_fields:
        assert f"MEGHA_{name.upper()}" in done.stdout, name
    assert "default" in done.stdout and "Traceback" not in done.stdout


@pytest.mark.parametrize(
    ("module", "env", "waiting_for"),
    [
        ("megha.services.gm", {"MEGHA_LM_URLS": "http://127.0.0.1:9"}, "LM 0 at http://127.0.0.1:9"),
        ("megha.services.lm", {"MEGHA_AMQP_URL": "amqp://guest:guest@127.0.0.1:9/"}, "RabbitMQ at amqp://"),
    ],
)
def test_sigterm_while_waiting_for_a_dependency_stops_the_service_at_once(
    module: str, env: dict[str, str], waiting_for: str
) -> None:
    import signal
    import time

    values = dict(os.environ) | {"MEGHA_PORT": str(free_port())} | env
    proc = subprocess.Popen(
        [sys.executable, "-m", module], env=values, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    seen = bytearray()

    def says_it_waits() -> bool:
        with contextlib.suppress(BlockingIOError):
            seen.extend(os.read(proc.stdout.fileno(), 1 << 16))  # type: ignore[union-attr]
        return f"waiting for {waiting_for}".encode() in seen

    try:
        wait_until(says_it_waits, 30, lambda: seen.decode())  # started, and waiting
        assert proc.poll() is None
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        os.set_blocking(proc.stdout.fileno(), True)
        rest, _ = proc.communicate(timeout=10)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    output = (seen + rest).decode()
    assert proc.returncode == 0 and took < 5, (proc.returncode, took, output)
    assert f"stopped by a signal while waiting for {waiting_for}" in output and "Traceback" not in output, output


def test_a_command_whose_reader_stops_reading_exits_1_without_a_traceback() -> None:
    """`megha ... | head`: the command and the experiments' `python -m` entry points end as a Unix tool does on a
    closed pipe (status 1, nothing on stderr), not with a BrokenPipeError traceback."""
    code = (
        "from megha.common.lifecycle import exit_quietly_if_stdout_closed\n"
        "exit_quietly_if_stdout_closed(lambda: print('x' * 1_000_000) or 0)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.read(5) == b"xxxxx"
    child.stdout.close()
    err = child.stderr.read().decode()
    assert child.wait(timeout=60) == 1 and err == "", err


def test_a_command_read_to_the_end_exits_with_its_status() -> None:
    code = (
        "from megha.common.lifecycle import exit_quietly_if_stdout_closed\nexit_quietly_if_stdout_closed(lambda: 3)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (3, "")
