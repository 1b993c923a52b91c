"""Benchmark: round-trip time of one LM launch call and one worker-agent launch call, for 1 and 50 placements.

Starts a 1 GM / 1 LM / 1 simulated-agent deployment (RabbitMQ at 127.0.0.1:5672) and times 30 calls of each
through the client the services call each other with (`megha.services.client.ServiceClient`), so the figure is
what one hop of a launch costs: the client, the server's HTTP and JSON handling, and the route's work.

    python bench/hop_latency.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

from megha.common.core.messages import LaunchBatch, Placement, WorkerLaunch
from megha.common.core.task import TaskSpec
from megha.common.models import LaunchBatchModel, WorkerLaunchModel
from megha.deploy.local import LocalDeployment
from megha.services.client import ServiceClient

NODES = 2000
CALLS = 30


def placements(prefix: str, n: int, first_node: int) -> list[Placement]:
    return [
        Placement(TaskSpec(f"{prefix}.{i}", prefix, "u", 0.01, (1000, 1024), 0), 0, (first_node + i) % NODES, False)
        for i in range(n)
    ]


async def timed_post(client: ServiceClient, url: str, body: bytes) -> float:
    start = time.perf_counter()
    reply = await client.post(url, body)
    elapsed = time.perf_counter() - start
    if not 200 <= reply.status < 300:
        raise RuntimeError(f"{url} answered {reply.status}: {reply.text[:300]}")
    return elapsed


async def measure(lm: str, worker: str, deployment: LocalDeployment) -> None:
    """Median times of launch calls as a GM and an LM make them (signed as GM 0 and LM 0: authentication is on, as
    deployed)."""
    client = ServiceClient(timeout=10.0, authorization=lambda: deployment.headers_as("gm", "0")["Authorization"])
    as_lm = ServiceClient(timeout=10.0, authorization=lambda: deployment.headers_as("lm", "0")["Authorization"])
    print("| placements per call | LM /v1/launch median ms | worker /v1/tasks median ms |")
    print("| --- | --- | --- |")
    for n in (1, 50):
        to_lm, to_worker = [], []
        for k in range(CALLS):
            batch = LaunchBatch(0, 0, 1 + k + 100 * n, placements(f"lm{n}-{k}", n, k * n))
            to_lm.append(await timed_post(client, f"{lm}/v1/launch", LaunchBatchModel.core_json(batch)))
            await asyncio.sleep(0.05)  # let the tasks (10 ms) finish so the nodes are free again
            launch = WorkerLaunch(0, placements(f"w{n}-{k}", n, k * n + 7))
            to_worker.append(await timed_post(as_lm, f"{worker}/v1/tasks", WorkerLaunchModel.core_json(launch)))
            await asyncio.sleep(0.05)
        print(f"| {n} | {statistics.median(to_lm) * 1000:.1f} | {statistics.median(to_worker) * 1000:.1f} |")
    await client.aclose()
    await as_lm.aclose()


def main() -> int:
    deployment = LocalDeployment(
        gms=1,
        lms=1,
        workers_per_lm=1,
        nodes_per_worker=NODES,
        execution="simulated",
        node_cpu_millicores=1000,
        node_memory_mb=1024,
    )
    with deployment:
        worker = next(p.url for p in deployment.processes if p.name.startswith("worker"))
        asyncio.run(measure(deployment.lm_urls[0], worker, deployment))
    return 0


if __name__ == "__main__":
    sys.exit(main())
