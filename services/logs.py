"""Every service's log lines: one handler, text or JSON lines (uvicorn's included), and the ids a line about a
decision names (`ids`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

from megha.common.core.messages import PreemptRequest, PreemptResponse
from megha.common.printable import printable

LogFormat = Literal["text", "json"]

_log_format: LogFormat = "text"

_NOT_EXTRA = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName", "color_message"}
"""What a log record holds besides the fields given with `extra=` (uvicorn's `color_message` is its message again,
with terminal colours)."""


def _extra(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _NOT_EXTRA}


def ids(
    *,
    job: object = None,
    task: object = None,
    attempt: object = None,
    gm: object = None,
    lm: object = None,
    node: object = None,
    worker: object = None,
    user: object = None,
) -> dict[str, object]:
    """The `extra=` of a log line about a decision (a refusal, an inconsistency, a repartition, a preemption, a
    retry, a loss, a worker taken out of service): the ids it concerns under these key names only, each an id or
    a list of ids; those not given (None) are left out. docs/deploy.md ("Logs") lists the decisions and keys."""
    fields = {
        "job": job,
        "task": task,
        "attempt": attempt,
        "gm": gm,
        "lm": lm,
        "node": node,
        "worker": worker,
        "user": user,
    }
    return {k: v for k, v in fields.items() if v is not None}


class TextFormatter(logging.Formatter):
    """`<time> <service> <LEVEL> <logger>: <message>`, then each field given with `extra=` as ` key=value`; one
    line each (line breaks and control characters in them escaped: `common/printable.py`), a traceback below it."""

    def __init__(self, service: str) -> None:
        super().__init__(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record) + "".join(f" {k}={v}" for k, v in _extra(record).items())
        return printable(line)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (ISO 8601, UTC), level, logger, service, message, each field given with
    `extra=` (ids of jobs, tasks, GMs, LMs, nodes), and exc_info / stack_info as formatted text when there are."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")[:-6] + "Z",
            "level": record.levelname,
            "logger": record.name,
            "service": self.service,
            "message": record.getMessage(),
        }
        for key, value in _extra(record).items():
            entry.setdefault(key, value)  # an extra field never hides one of the above
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc_info"] = record.exc_text
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


_FORMATTERS: dict[LogFormat, Callable[[str], logging.Formatter]] = {"text": TextFormatter, "json": JsonFormatter}


def use_log_format(log_format: LogFormat) -> None:
    """The format `configure_logging` gives this process's log lines when its caller names none: `run.py` sets
    MEGHA_LOG_FORMAT's before it creates a service's app, whose `create_app` names the service."""
    global _log_format
    _log_format = log_format


def configure_logging(level: str, name: str, log_format: LogFormat | None = None) -> logging.Logger:
    """Every log line of the process on stderr through one handler on the root logger, in `log_format` (None: the
    one `use_log_format` chose, text unless told) and naming the service `name`. uvicorn's loggers have no handler
    of their own (`run.py`), so its lines take the same way. As with `logging.basicConfig`, a root logger that
    already has a handler (an earlier call, a test's log capture) is left as it is."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(_FORMATTERS[log_format or _log_format](name))
        root.addHandler(handler)
        root.setLevel(level.upper())
        logging.captureWarnings(True)  # a Python warning is a log line too, not a line in another format
    # The broker client says what it waits for and when it is back; aio-pika's own reconnection attempts would
    # repeat that every second, aiormq's as errors.
    logging.getLogger("aio_pika").setLevel(logging.WARNING)
    logging.getLogger("aiormq").setLevel(logging.CRITICAL)
    connection = logging.getLogger("aiormq.connection")  # but for the broker blocking this connection's publishes
    connection.setLevel(logging.WARNING)
    if not any(isinstance(f, _PublishesBlocked) for f in connection.filters):
        connection.addFilter(_PublishesBlocked())
    tools = logging.getLogger("aio_pika.tools")
    if not any(isinstance(f, _ClosedChannelNoise) for f in tools.filters):
        tools.addFilter(_ClosedChannelNoise())
    return logging.getLogger(name)


class _PublishesBlocked(logging.Filter):
    """Keeps, of aiormq's connection lines, only RabbitMQ's blocking of the connection (a resource alarm: its disk or
    memory is short, and it takes no message from any publisher until the alarm clears) and its unblocking, in the
    words of an operator; without them a disk alarm shows only as publishes that time out. Drops the others, as
    aiormq's other loggers are (the services say themselves when the broker is away and when it is back)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Connection %r was blocked by: %r":
            record.msg = (
                "RabbitMQ blocked this connection's publishes: %s (a resource alarm: the broker is short of disk or "
                "memory; messages wait in this service's outbox until it clears)"
            )
            record.args = (record.args[1],) if isinstance(record.args, tuple) and len(record.args) == 2 else ("?",)
            return True
        if record.msg == "Connection %r was unblocked":
            record.msg, record.args = "RabbitMQ unblocked this connection's publishes", ()
            return True
        return False


class _ClosedChannelNoise(logging.Filter):
    """Drops aio-pika's ERROR line when a channel's close callback finds the connection already gone
    ("... RobustChannel._on_close ... ChannelInvalidStateError: No active transport in channel"): it comes with every
    loss of the broker connection, beside the service's own warning that it reconnects, and reads as a second
    fault. Every other line of aio_pika.tools passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("_on_close" in message and "ChannelInvalidStateError" in message)


def log_preemption(log: logging.Logger, req: PreemptRequest, response: PreemptResponse) -> None:
    """One line on how a preemption request ended, as the LM that decided it and the GM that sent it log it: the
    node its task runs on and the runs it preempted, or why the LM refused."""
    t = req.task
    about = ids(job=t.job_id, task=t.task_id, attempt=t.attempt, gm=req.gm, lm=req.lm, user=t.user)
    if response.placement is not None:
        log.info(
            "task %s (user %s) of GM %d runs on LM %d node %d after preempting %s",
            t.task_id,
            t.user,
            req.gm,
            req.lm,
            response.placement.node,
            response.preempted,
            extra=about | {"node": response.placement.node},
        )
    else:
        log.info(
            "LM %d refused to preempt for task %s (user %s) of GM %d: %s",
            req.lm,
            t.task_id,
            t.user,
            req.gm,
            response.reason,
            extra=about,
        )
