"""What the service tests share: the local RabbitMQ, and a marker that skips (with the reason) when it is down."""

from __future__ import annotations

import socket

import pytest

AMQP = "amqp://guest:guest@127.0.0.1:5672/"


def rabbitmq_up() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
    except OSError:
        return False
    return True


needs_rabbitmq = pytest.mark.skipif(not rabbitmq_up(), reason="needs RabbitMQ at 127.0.0.1:5672 (.ci/run starts it)")
