"""A RabbitMQ node of one `megha local` run's own, with a broker user per role and no `guest`.

RabbitMQ's default account, `guest`, is an administrator that the broker lets in from its own machine, and on
`megha local`'s machine the exec tasks run too: with the default `MEGHA_AMQP_URL` any task could log in as `guest`
and publish deltas and completions to the GMs or delete the run's queues (docs/security.md, "Broker users"). So
when `megha local` runs real tasks against the default URL it starts a node of its own instead
(`deploy/broker_node.py`: Debian's `rabbitmq-server`, or the megha-rabbitmq image), imports the run's users, each
allowed its role's exchanges and queues (`deploy/secrets.definitions`), deletes `guest`, and gives each service its
role's URL; the passwords are made afresh and reach the services in their environment only, which a task (a uid of
its own) cannot read. The node and its data are removed when the run ends.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from megha.common.auth import new_secret
from megha.common.transport.rabbit import BROKER_ROLES, broker_user
from megha.deploy.broker_node import broker_node
from megha.deploy.local import BrokerUnreachable, check_broker
from megha.deploy.secrets import ADMIN, definitions, role_url

USERS_TIMEOUT = 60.0
"""Seconds the node has to let every imported user log in (RabbitMQ imports definitions asynchronously)."""


@dataclass(frozen=True, slots=True)
class RunBroker:
    """The run's node: each role's URL (`gm`, `lm`, `worker`, `loadgen`) and its administrator's (which removes the
    run's queues at the end)."""

    urls: dict[str, str]
    admin_url: str


@contextmanager
def run_broker(run_id: str) -> Iterator[RunBroker]:
    """Start a node of its own for run `run_id`, with its role users and no `guest`; removed on exit. RuntimeError
    (one line) when this machine has neither `rabbitmq-server` nor the RabbitMQ image; TimeoutError when the node
    does not start or its users cannot log in."""
    with broker_node() as node:  # started, and removed on exit
        passwords = {role: new_secret() for role in (*BROKER_ROLES, ADMIN)}
        node.ctl("import_definitions", input=json.dumps(definitions(run_id, passwords)), timeout=60)
        base = f"amqp://127.0.0.1:{node.port}/"
        urls = {role: role_url(base, broker_user(run_id, role), passwords[role]) for role in BROKER_ROLES}
        admin_url = role_url(base, broker_user(run_id, ADMIN), passwords[ADMIN])
        _wait_for_logins([*urls.values(), admin_url])
        node.ctl("delete_user", "guest", timeout=60)
        yield RunBroker(urls, admin_url)


def _wait_for_logins(urls: list[str]) -> None:
    deadline = time.monotonic() + USERS_TIMEOUT
    while True:
        try:
            for url in urls:
                check_broker(url)
            return
        except BrokerUnreachable:  # not yet imported: try again
            if time.monotonic() > deadline:
                raise TimeoutError(f"the run's broker users could not log in after {USERS_TIMEOUT:g} s") from None
            time.sleep(0.2)
