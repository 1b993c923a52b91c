"""GET /metrics of the GM, LM and worker-agent services (services/metrics.py, services/{gm,lm,worker}/metrics.py):
Prometheus's text format, one registry per app, and values that agree with each service's JSON API after a real run
through separate processes."""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.settings import GMSettings, LMSettings, LoadgenSettings, WorkerSettings
from megha.deploy.local import free_port
from megha.loadgen.services import replay_services
from megha.services.gm.app import create_app as create_gm
from megha.services.gm.metrics import ALLOCATION_TIME_BUCKETS, TaskMeter
from megha.services.lm.app import create_app as create_lm
from megha.services.worker.app import create_app as create_worker

from servicekit import api, needs_rabbitmq, small_deployment, wait_until

NOWHERE = "http://127.0.0.1:9"
CLUSTER = ClusterSpec(((PartitionSpec(0, 0, ((2000, 4096), (4000, 8192)), (0, 0)),),))
RESOURCES = ("cpu_millicores", "memory_mb")


def parse(text: str) -> dict[str, list[Sample]]:
    """Samples by family name (counters under their name without `_total`, as the parser gives them)."""
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def value(families: dict[str, list[Sample]], sample: str, **labels: str) -> float:
    """The one sample named `sample` whose labels include `labels`; fails when there is none or several."""
    found = [
        s.value
        for samples in families.values()
        for s in samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (sample, labels, found)
    return found[0]


def labelled(families: dict[str, list[Sample]], sample: str, label: str) -> dict[str, float]:
    """`sample`'s values by the value of `label`."""
    return {s.labels[label]: s.value for samples in families.values() for s in samples if s.name == sample}


def assert_identity(families: dict[str, list[Sample]], key: str, ident: str) -> None:
    """Every sample carries the service's identity label; build info says which Megha and Python run."""
    for samples in families.values():
        for s in samples:
            assert s.labels.get(key) == ident, s
    (info,) = families["megha_build_info"]
    assert info.value == 1 and info.labels["version"] and info.labels["python"].count(".") == 2


# ----------------------------------------------------------------------------------------------- in-process


def client(app) -> httpx.AsyncClient:  # type: ignore[no-untyped-def]
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


@pytest.mark.asyncio
async def test_each_app_has_its_own_registry_and_the_route_is_text_outside_the_openapi_schema() -> None:
    apps = [
        create_gm(GMSettings(gm_id=g, lm_urls=[NOWHERE], http_timeout=1.0, lm_timeout=0.5), False, CLUSTER)
        for g in (0, 1)
    ]
    async with apps[0].router.lifespan_context(apps[0]), client(apps[0]) as c0, client(apps[1]) as c1:
        # GM 1's app is not started: no core yet, so only its identity's build info; GM 0's counts are its own.
        r = await c0.post("/v1/jobs", json={"tasks": [{"cpu_millicores": 1000, "memory_mb": 10, "duration": 1}] * 3})
        assert r.status_code == 201, r.text
        r0, r1 = await c0.get("/metrics"), await c1.get("/metrics")
        assert r0.status_code == 200 and r0.headers["content-type"].startswith("text/plain; version=0.0.4")
        m0, m1 = parse(r0.text), parse(r1.text)
        assert_identity(m0, "gm", "0")
        assert_identity(m1, "gm", "1")
        assert value(m0, "megha_task_attempts_total") == 3
        assert value(m0, "megha_allocation_time_seconds_count") == 3
        assert "megha_task_attempts" not in m1 and "megha_allocation_time_seconds" not in m1
        assert "/metrics" not in (await c0.get("/openapi.json")).text
    lm = create_lm(LMSettings(lm_id=3, expected_nodes=2, num_gms=1), use_broker=False)
    agent = create_worker(WorkerSettings(execution="simulated", worker_id="w-3-0", lm_url=NOWHERE), use_broker=False)
    try:
        async with client(lm) as c, client(agent) as a:
            assert_identity(parse((await c.get("/metrics")).text), "lm", "3")
            m = parse((await a.get("/metrics")).text)
            assert_identity(m, "worker", "w-3-0")
            assert value(m, "megha_worker_registered") == 0
    finally:
        await agent.state.agent.close()


def test_allocation_times_fall_in_the_bucket_of_their_upper_bound_and_recovered_runs_are_not_observed() -> None:
    meter = TaskMeter()
    meter.decided(0.0, 1, ALLOCATION_TIME_BUCKETS[0])  # exactly on a bound: counted as <= it
    meter.decided(100.0, 2, 100.0 + 3 * 3600)  # queued for three hours
    meter.decided(100.0, 1, 100.0 + 10 * 86400)  # above the last bound: +Inf only
    meter.decided(100.0, 0, 200.0)  # a run a restarted GM recovered from an LM: decided before its restart
    assert meter.count == 3 and meter.sum == pytest.approx(ALLOCATION_TIME_BUCKETS[0] + 3 * 3600 + 10 * 86400)
    assert meter.buckets[0] == 1 and meter.buckets[ALLOCATION_TIME_BUCKETS.index(14400.0)] == 1
    assert meter.buckets[-1] == 1 and sum(meter.buckets) == 3
    assert ALLOCATION_TIME_BUCKETS[0] <= 0.001 and ALLOCATION_TIME_BUCKETS[-1] >= 8 * 3600


# ------------------------------------------------------------------------------------------ separate processes


def get(url: str) -> dict:  # type: ignore[type-arg]
    r = api.get(url, timeout=5.0)
    assert r.status_code == 200, (url, r.status_code, r.text[:300])
    return r.json()


def scrape(url: str) -> dict[str, list[Sample]]:
    r = api.get(f"{url}/metrics", timeout=5.0)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text[:300]
    return parse(r.text)


def steady(url: str, path: str, check: Callable[[dict, dict[str, list[Sample]]], bool], timeout: float = 20.0) -> None:  # type: ignore[type-arg]
    """Until `check(state, metrics)` holds for a scrape taken between two equal answers of `path` (the service did
    not change meanwhile, so the two must agree); fails with the last pair seen."""
    seen: list[object] = []

    def agree() -> bool:
        before = stable(get(f"{url}{path}"))
        metrics = scrape(url)
        after = stable(get(f"{url}{path}"))
        seen[:] = [before, {k: v for k, v in metrics.items() if k.startswith(("megha_gm", "megha_lm"))}]
        return before == after and check(before, metrics)

    wait_until(agree, timeout, lambda: seen, every=0.1)


def stable(state: dict) -> dict:  # type: ignore[type-arg]
    """A state without what changes by itself as time passes (an LM's heartbeat ages)."""
    return {k: v for k, v in state.items() if k != "heartbeats"}


def partition_sizes(lm_url: str) -> list[int]:
    return [len(p["capacities"]) for p in get(f"{lm_url}/v1/cluster")["partitions"]]


def free_by_partition(state: dict, sizes: list[int], key: str = "free") -> dict[tuple[str, str], float]:  # type: ignore[type-arg]
    """/v1/state's per-node amounts summed per (resource, partition): partition g's nodes follow g-1's."""
    sums: dict[tuple[str, str], float] = {}
    node = 0
    for gm, size in enumerate(sizes):
        for amounts in state[key][node : node + size]:
            for name, amount in zip(RESOURCES, amounts):
                sums[(name, str(gm))] = sums.get((name, str(gm)), 0) + amount
        node += size
    return sums


def lm_free_metrics(metrics: dict[str, list[Sample]], sample: str = "megha_lm_free_resources") -> dict:  # type: ignore[type-arg]
    return {
        (s.labels["resource"], s.labels["partition"]): s.value
        for samples in metrics.values()
        for s in samples
        if s.name == sample
    }


# A GM's and an LM's counters: metric sample -> the /v1/state key holding the same count.
GM_COUNTS = {
    "megha_gm_repartitions_total": "repartitions",
    "megha_gm_inconsistencies_total": "inconsistencies",
    "megha_task_reschedules_total": "reschedules",
    "megha_task_retries_total": "retries",
    "megha_task_failures_retried_total": "failures_retried",
    "megha_gm_preemption_attempts_total": "preemption_attempts",
    "megha_gm_preempted_tasks_total": "preempted",
    "megha_gm_ignored_run_ends_total": "ignored_run_ends",
}
LM_COUNTS = {
    "megha_inconsistencies_total": "inconsistencies",
    "megha_repartitions_total": "repartitions",
    "megha_lm_launched_tasks_total": "launched",
    "megha_lm_preemption_refusals_total": "preemption_refusals",
    "megha_lm_failed_launches_total": "failed_launches",
    "megha_lm_running_tasks": "running",
    "megha_lm_logical_nodes": "logical_nodes",
    "megha_lm_registered_nodes": "registered_nodes",
}


def assert_counts_agree(m: dict[str, list[Sample]], state: dict[str, Any], counts: dict[str, str]) -> None:
    for sample, key in counts.items():
        assert value(m, sample) == state[key], (sample, state)


@needs_rabbitmq
def test_metrics_agree_with_the_json_api_after_a_real_run_through_separate_processes(tmp_path: Path) -> None:
    # Two GMs and two LMs with one simulated agent of two 1-core nodes each; user A's queue on GM 0, B's on GM 1.
    # A asks for six 1-core tasks: four run (two by repartitioning GM 1's partitions), two wait at GM 0. Then B's
    # task arrives at GM 1 with A over its share: GM 1 preempts one of A's tasks (or finds a node freed).
    node = {"node_cpu_millicores": 1000, "node_memory_mb": 1024}
    deployment = small_deployment(
        tmp_path / "logs", gms=2, lms=2, nodes_per_worker=2, queues="A:0.5:0,B:0.5:1", delta_interval=0.2, **node
    )
    task = {"cpu_millicores": 1000, "memory_mb": 64}
    label = {"A": "#1", "B": "#2"}  # /metrics names no user by default: a queue is its place in MEGHA_QUEUES
    with deployment:
        api.use(deployment)
        gm0, gm1 = deployment.gm_urls
        lms = deployment.lm_urls
        workers = {p.name: p.url for p in deployment.processes if p.name.startswith("worker-")}
        r = api.post(f"{gm0}/v1/jobs", json={"user": "A", "job_id": "a", "tasks": [{**task, "duration": 8}] * 6})
        assert r.status_code == 201, r.text

        # While A's tasks wait: GM 0's pending and running tasks, per queue, are those of /v1/state.
        def pending_agrees(state: dict, m: dict[str, list[Sample]]) -> bool:  # type: ignore[type-arg]
            pending = labelled(m, "megha_gm_pending_tasks", "queue")
            running = labelled(m, "megha_gm_running_tasks", "queue")
            return (
                pending == {"#1": state["queued"] + state["waiting"]}
                and pending["#1"] == 2
                and running == {"#1": state["running"]}
                and running["#1"] == 4
            )

        steady(gm0, "/v1/state", pending_agrees)
        # Every LM is full: no CPU free in any partition, as /v1/state says node by node.
        for lm in lms:
            sizes = partition_sizes(lm)
            steady(
                lm,
                "/v1/state",
                lambda state, m, sizes=sizes: (
                    lm_free_metrics(m) == free_by_partition(state, sizes)
                    and not any(v for (name, _), v in lm_free_metrics(m).items() if name == "cpu_millicores")
                    and lm_free_metrics(m, "megha_lm_capacity_resources") == free_by_partition(state, sizes, "capacity")
                ),
            )
        r = api.post(f"{gm1}/v1/jobs", json={"user": "B", "job_id": "b", "tasks": [{**task, "duration": 1}]})
        assert r.status_code == 201, r.text

        def all_ended() -> bool:
            return all(t["state"] == "finished" for job in (("a", gm0), ("b", gm1)) for t in tasks(*job))

        def tasks(job: str, url: str) -> list[dict]:  # type: ignore[type-arg]
            return get(f"{url}/v1/jobs/{job}")["tasks"]

        wait_until(all_ended, 60, lambda: [tasks("a", gm0), tasks("b", gm1)])
        wait_until(lambda: all(s["idle"] for s in deployment.lm_states()), 20, deployment.lm_states)

        def gms_saw_everything_end() -> bool:  # the GMs learn the last completions and deltas
            states = [get(f"{url}/v1/state") for url in (gm0, gm1)]
            return all(
                s["unfinished_tasks"] == 0 and all(p["used_fraction"] == 0.0 for p in s["partitions"]) for s in states
            )

        wait_until(gms_saw_everything_end, 20, lambda: [get(f"{url}/v1/state") for url in (gm0, gm1)])

        gm_repartitions = 0
        for g, (url, job) in enumerate(((gm0, "a"), (gm1, "b"))):
            state, queues, m = get(f"{url}/v1/state"), get(f"{url}/v1/queues"), scrape(url)
            job_tasks = tasks(job, url)
            assert_identity(m, "gm", str(g))
            own = {0: "#1", 1: "#2"}[g]
            assert labelled(m, "megha_gm_pending_tasks", "queue") == {own: 0}
            assert labelled(m, "megha_gm_running_tasks", "queue") == {own: 0}
            assert value(m, "megha_gm_unfinished_tasks") == state["unfinished_tasks"] == 0
            # Counters: the core's, as /v1/state reports them, and the job's tasks' own tallies.
            assert value(m, "megha_task_attempts_total") == sum(t["attempts"] for t in job_tasks) >= len(job_tasks)
            assert_counts_agree(m, state, GM_COUNTS)
            assert value(m, "megha_gm_preemptions_total", reason="fair_share") == state["preemptions"]
            assert value(m, "megha_gm_inconsistencies_total") == sum(t["inconsistencies"] for t in job_tasks)
            assert value(m, "megha_gm_preempted_tasks_total") == sum(t["preemptions"] for t in job_tasks)
            gm_repartitions += state["repartitions"]
            # Allocation time: one observation per placement decision, at least one per task; the last decision
            # of each task is its launched_at.
            count = value(m, "megha_allocation_time_seconds_count")
            requeued = sum(t["inconsistencies"] + t["retries"] + t["preemptions"] for t in job_tasks)
            assert len(job_tasks) + requeued <= count <= len(job_tasks) + requeued + state["preemption_attempts"]
            buckets = [s for s in m["megha_allocation_time_seconds"] if s.name.endswith("_bucket")]
            assert [float(s.labels["le"]) for s in buckets] == [*ALLOCATION_TIME_BUCKETS, math.inf]
            counts = [s.value for s in buckets]
            assert counts == sorted(counts) and counts[-1] == count
            last = sum(t["launched_at"] - t["arrival"] for t in job_tasks)
            total = value(m, "megha_allocation_time_seconds_sum")
            assert total >= last - 1e-6
            if count == len(job_tasks):
                assert total == pytest.approx(last, abs=1e-6)
            # Fair scheduling: each queue's share and usage as /v1/queues reports them.
            assert queues["fair_scheduling"]
            shares = labelled(m, "megha_queue_share", "queue")
            assert shares == {label[q["user"]]: q["share"] for q in queues["queues"]} == {"#1": 0.5, "#2": 0.5}
            usage = labelled(m, "megha_queue_usage", "queue")
            assert usage.keys() == {"#1", "#2"}
            for q in queues["queues"]:
                assert usage[label[q["user"]]] == pytest.approx(q["consumption"], abs=1e-6)
                for name, amount in zip(RESOURCES, q["usage"]):
                    assert value(m, "megha_queue_resource_usage", queue=label[q["user"]], resource=name) == amount
            assert value(m, "megha_gm_serving") == 1
        assert gm_repartitions >= 2, "A's six tasks fit GM 0's partitions only by repartitioning"

        lm_repartitions = 0
        for i, url in enumerate(lms):
            state, m = get(f"{url}/v1/state"), scrape(url)
            assert_identity(m, "lm", str(i))
            sizes = partition_sizes(url)
            assert lm_free_metrics(m) == free_by_partition(state, sizes) == free_by_partition(state, sizes, "capacity")
            assert value(m, "megha_lm_nodes", state="in_service") == len(state["capacity"]) == 2
            assert value(m, "megha_lm_nodes", state="out_of_service") == len(state["down_nodes"]) == 0
            assert_counts_agree(m, state, LM_COUNTS)
            assert value(m, "megha_preemptions_total", reason="fair_share") == state["preemptions"]
            assert value(m, "megha_broker_published_total") > 0  # deltas and completions went out
            assert value(m, "megha_broker_publish_failures_total") == 0
            lm_repartitions += state["repartitions"]
        assert lm_repartitions >= 2

        for name, url in workers.items():
            m = scrape(url)
            assert_identity(m, "worker", name)
            assert value(m, "megha_worker_registered") == 1
            assert value(m, "megha_worker_running_tasks") == len(get(f"{url}/v1/state")["running"]) == 0
            assert labelled(m, "megha_worker_free_resources", "resource") == {"cpu_millicores": 2000, "memory_mb": 2048}
            assert value(m, "megha_broker_published_total") > 0  # task events and reports
    assert deployment.processes == []


@needs_rabbitmq
def test_each_lm_counts_what_it_decides_through_its_core_observer_during_a_replay(tmp_path: Path) -> None:
    # Two GMs, two LMs of four simulated nodes each. The LMs' counts come from their cores' observer events; they
    # are checked against what the load generator and the GMs (their own cores' counters) saw.
    deployment = small_deployment(tmp_path / "logs", gms=2, lms=2, nodes_per_worker=4)
    settings = LoadgenSettings(trace="syn:4:10", time_scale=0.3)
    with deployment:
        api.use(deployment)
        gms, lms = deployment.gm_urls, deployment.lm_urls
        run = asyncio.run(replay_services(deployment.loadgen(settings)))
        assert run.metrics is not None and run.metrics.tasks_completed == run.metrics.tasks == 40
        wait_until(lambda: all(s["idle"] for s in deployment.lm_states()), 20, deployment.lm_states)

        def total(urls: list[str], sample: str, **labels: str) -> float:
            return sum(value(scrape(url), sample, **labels) for url in urls)

        # No faults, no fair scheduling: every task was launched exactly once, on one LM or the other.
        assert total(lms, "megha_lm_launched_tasks_total") == 40
        # Each placement an LM rejected as stale is one the GMs learnt of as an inconsistency, and each the LMs
        # placed on another GM's partition one the GMs decided as a repartition.
        assert total(lms, "megha_inconsistencies_total") == total(gms, "megha_gm_inconsistencies_total")
        assert total(lms, "megha_repartitions_total") == total(gms, "megha_gm_repartitions_total")
        for sample in ("megha_lm_malformed_placements_total", "megha_lm_stopped_tasks_total"):
            assert total(lms, sample) == 0, sample
        assert total(lms, "megha_preemptions_total", reason="fair_share") == 0

        # A job cancelled while its two tasks run: their LMs stop them, and say so.
        long = {"cpu_millicores": 1000, "memory_mb": 64, "duration": 600}
        r = api.post(f"{gms[0]}/v1/jobs", json={"user": "u", "job_id": "long", "tasks": [long] * 2}, timeout=10.0)
        assert r.status_code == 201, r.text
        wait_until(lambda: total(lms, "megha_lm_running_tasks") == 2, 20, lambda: deployment.lm_states())
        r = api.delete(f"{gms[0]}/v1/jobs/long", timeout=10.0)
        assert r.status_code in (200, 202), r.text
        wait_until(
            lambda: total(lms, "megha_lm_stopped_tasks_total") == 2 and total(lms, "megha_lm_running_tasks") == 0,
            20,
            lambda: [scrape(url).get("megha_lm_stopped_tasks") for url in lms],
        )
        assert total(lms, "megha_lm_launched_tasks_total") == 42
        assert sum(s["stopped"] for s in deployment.lm_states()) == 2  # /v1/state says the same
    assert deployment.processes == []


# ------------------------------------------------------------------------------------------- a real Prometheus


def prometheus_binary() -> str:
    """The `prometheus` binary (Debian package `prometheus`; .ci/run installs it): missing, the test fails under
    CI=true and is skipped elsewhere."""
    binary = shutil.which("prometheus")
    if binary is None:
        why = "needs the prometheus binary (apt-get install prometheus; .ci/run installs it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)
        pytest.skip(why)
    return binary


def query(prometheus: str, promql: str) -> float | None:
    """The value of an instant query with one series in its answer, or None while it has none."""
    r = httpx.get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=5.0)
    assert r.status_code == 200, r.text
    result = r.json()["data"]["result"]
    return float(result[0]["value"][1]) if len(result) == 1 else None


@needs_rabbitmq
def test_a_real_prometheus_scrapes_every_service_during_a_replay(tmp_path: Path) -> None:
    binary = prometheus_binary()
    deployment = small_deployment(tmp_path / "logs", gms=2, lms=2, workers_per_lm=2, nodes_per_worker=4)
    settings = LoadgenSettings(trace="demo", first_jobs=10, time_scale=0.0002, mode="scaled", mem_scale=1000)
    port = free_port()
    prometheus = f"http://127.0.0.1:{port}"
    with deployment:
        api.use(deployment)
        targets = [p.url.removeprefix("http://") for p in deployment.processes]
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            f"scrape_configs:\n  - job_name: megha\n    static_configs:\n      - targets: {json.dumps(targets)}\n"
        )
        log = (tmp_path / "prometheus.log").open("wb")
        server = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:

            def ready() -> bool:
                assert server.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
                try:
                    return httpx.get(f"{prometheus}/-/ready", timeout=1.0).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(ready, 60, lambda: (tmp_path / "prometheus.log").read_text()[-2000:], every=0.2)
            run = asyncio.run(replay_services(deployment.loadgen(settings)))
            assert run.metrics is not None and run.metrics.tasks_completed == run.metrics.tasks > 0
            wait_until(lambda: all(s["idle"] for s in deployment.lm_states()), 20, deployment.lm_states)
            launched = sum(s["launched"] for s in deployment.lm_states())
            assert launched >= run.metrics.tasks
            # Every target is up, and what Prometheus scraped adds up to what the LMs say they launched.
            wait_until(
                lambda: query(prometheus, 'count(up{job="megha"} == 1)') == len(targets),
                30,
                lambda: query(prometheus, 'count(up{job="megha"} == 1)'),
            )
            wait_until(
                lambda: query(prometheus, "sum(megha_lm_launched_tasks_total)") == launched,
                30,
                lambda: query(prometheus, "sum(megha_lm_launched_tasks_total)"),
            )
            placed = query(prometheus, "sum(megha_allocation_time_seconds_count)")
            assert placed is not None and placed >= run.metrics.tasks
            assert query(prometheus, 'count(megha_build_info{gm!=""} or megha_build_info{lm!=""})') == 4
        finally:
            server.terminate()
            server.wait(30)
            log.close()
    assert deployment.processes == []
