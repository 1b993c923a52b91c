"""The test run's own set-up: a missing ../shared file skips naming it, and the RabbitMQ container the run starts
when no broker answers and rabbitmq-server is not installed (a `ContainerNode`: tests/test_broker_node.py has the
rest of it)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import aio_pika
import pytest
from brokerkit import CONTAINER, rabbitmqctl
from conftest import _shared_file

from megha.deploy.broker_node import ContainerNode


def test_a_missing_shared_file_skips_the_test_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "syn_250.0.tr"
    with pytest.raises(pytest.skip.Exception, match=f"needs {missing}"):
        _shared_file(missing)
    missing.write_text("")
    assert _shared_file(missing) == missing


@pytest.mark.docker
def test_the_broker_container_takes_guest_clients_and_rabbitmqctl_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    container = ContainerNode()
    with container:
        monkeypatch.setenv(CONTAINER, container.name)

        async def round_trip() -> bytes:
            connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{container.port}/", timeout=10)
            async with connection:
                channel = await connection.channel()
                queue = await channel.declare_queue("probe", auto_delete=True)
                await channel.default_exchange.publish(aio_pika.Message(b"hello"), routing_key="probe")
                message = await queue.get(timeout=5)
                await message.ack()
                return message.body

        assert asyncio.run(round_trip()) == b"hello"
        users = rabbitmqctl("list_users", capture_output=True, text=True, timeout=60)
        assert users.returncode == 0 and "guest" in users.stdout, users
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"name={container.name}"], capture_output=True, text=True)
    assert left.stdout.strip() == ""
