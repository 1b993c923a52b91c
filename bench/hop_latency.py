"""Benchmark: round-trip time of one LM launch call and one worker-agent launch call, for 1 and 50 placements.

Starts a 1 GM / 1 LM / 1 simulated-agent deployment (RabbitMQ at 127.0.0.1:5672) and times 30 calls of each
through a synchronous httpx client (so the figure includes client overhead).

    python bench/hop_latency.py
"""

from __future__ import annotations

import statistics
import sys
import time

import httpx

from megha.common.core.messages import LaunchBatch, Placement, WorkerLaunch
from megha.common.core.task import TaskSpec
from megha.common.models import LaunchBatchModel, WorkerLaunchModel
from megha.deploy.local import LocalDeployment

NODES = 2000
CALLS = 30


def placements(prefix: str, n: int, first_node: int) -> list[Placement]:
    return [
        Placement(TaskSpec(f"{prefix}.{i}", prefix, "u", 0.01, (1000, 1024), 0), 0, (first_node + i) % NODES, False)
        for i in range(n)
    ]


def timed_post(client: httpx.Client, url: str, body: str) -> float:
    start = time.perf_counter()
    client.post(url, content=body, headers={"content-type": "application/json"}).raise_for_status()
    return time.perf_counter() - start


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
    with deployment, httpx.Client() as client:
        lm = deployment.lm_urls[0]
        worker = next(p.url for p in deployment.processes if p.name.startswith("worker"))
        print("| placements per call | LM /v1/launch median ms | worker /v1/tasks median ms |")
        print("| --- | --- | --- |")
        for n in (1, 50):
            to_lm, to_worker = [], []
            for k in range(CALLS):
                batch = LaunchBatch(0, 0, 1 + k + 100 * n, placements(f"lm{n}-{k}", n, k * n))
                to_lm.append(timed_post(client, f"{lm}/v1/launch", LaunchBatchModel.from_core(batch).model_dump_json()))
                time.sleep(0.05)  # let the tasks (50 ms) finish so the nodes are free again
                launch = WorkerLaunch(0, placements(f"w{n}-{k}", n, k * n + 7))
                to_worker.append(
                    timed_post(client, f"{worker}/v1/tasks", WorkerLaunchModel.from_core(launch).model_dump_json())
                )
                time.sleep(0.05)
            print(f"| {n} | {statistics.median(to_lm) * 1000:.1f} | {statistics.median(to_worker) * 1000:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
