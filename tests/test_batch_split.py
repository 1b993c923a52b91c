"""Launch batches are split under the receiver's body limit (MAX_BODY_BYTES): the GM's calls to an LM and the LM's
calls to an agent. One user's big tasks (commands of up to MAX_RUN_CHARS characters) never make a batch fail with
413 for the other tasks in it; and no single task a user may submit is too big for a body on its own."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import httpx
import pytest

from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.core.messages import (
    Delta,
    LaunchBatch,
    LaunchResponse,
    NodeState,
    Placement,
    Rejection,
    WorkerLaunch,
)
from megha.common.core.task import RunSpec, TaskSpec
from megha.common.models import (
    MAX_ARG_CHARS,
    MAX_BODY_BYTES,
    MAX_RUN_CHARS,
    JobSubmission,
    LaunchBatchModel,
    WorkerLaunchModel,
    WorkerNode,
    WorkerRegistration,
)
from megha.common.settings import GMSettings, LMSettings
from megha.deploy.local import LocalDeployment
from megha.services.client import Reply
from megha.services.gm.app import create_app as create_gm
from megha.services.gm.dispatch import _merged
from megha.services.lm.service import LMService

from servicekit import needs_rabbitmq, wait_for, wait_until

NODE = WorkerNode(capacity={"cpu_millicores": 2000, "memory_mb": 4096})
ARG = 15_000  # four of these per task: 60 KB of command, so 40 tasks of one user are 2.4 MB and 81 tasks 4.9 MB


def placement(i: int, chars: int, node: int | None = None) -> Placement:
    args = ["x" * min(ARG, chars - k) for k in range(0, chars, ARG)]
    run = RunSpec("exec", ("/bin/true", *args), "", (), "")
    task = TaskSpec(f"j{i}.0", f"j{i}", f"user{i % 3}", 0.0, (10, 10), 0, 1, run)
    return Placement(task, 0, i % 4 if node is None else node, False)


def test_a_batch_that_fits_is_one_body_exactly_as_before() -> None:
    batch = LaunchBatch(0, 1, 7, [placement(i, 100) for i in range(50)])
    ((placements, body),) = LaunchBatchModel.core_json_parts(batch)
    assert placements == batch.placements and body == LaunchBatchModel.core_json(batch)


@pytest.mark.parametrize("limit", [20_000, 50_000, 200_000])
def test_a_batch_over_the_limit_goes_in_bodies_under_it_holding_every_placement_once_in_order(limit: int) -> None:
    batch = LaunchBatch(0, 1, 7, [placement(i, 500 * (i % 30)) for i in range(120)])
    assert len(LaunchBatchModel.core_json(batch)) > limit
    parts = LaunchBatchModel.core_json_parts(batch, limit)
    assert len(parts) > 1 and all(len(body) <= limit for _, body in parts)
    sent = []
    for placements, body in parts:
        part = LaunchBatchModel.model_validate_json(body).to_core()
        assert (part.gm, part.lm, part.seq) == (0, 1, 7)  # each part is a batch of the same seq
        assert part.placements == placements and body == LaunchBatchModel.core_json(part)
        sent += placements
    assert sent == batch.placements
    # The same for an LM's launch on an agent.
    launch = WorkerLaunch(1, batch.placements)
    parts = WorkerLaunchModel.core_json_parts(launch, limit)
    assert len(parts) > 1 and all(len(body) <= limit for _, body in parts)
    assert [p for _, body in parts for p in WorkerLaunchModel.model_validate_json(body).to_core().launches] == (
        launch.launches
    )


def test_a_placement_too_big_on_its_own_goes_alone_and_takes_no_other_with_it() -> None:
    small = [placement(i, 10) for i in range(6)]
    huge = placement(99, 5_000)
    batch = LaunchBatch(0, 0, 3, [*small[:3], huge, *small[3:]])
    parts = LaunchBatchModel.core_json_parts(batch, 2_000)
    alone = [(placements, body) for placements, body in parts if huge in placements]
    assert [placements for placements, _ in alone] == [[huge]] and len(alone[0][1]) > 2_000
    assert all(len(body) <= 2_000 for placements, body in parts if huge not in placements)
    assert [p for placements, _ in parts for p in placements] == batch.placements


def test_the_answers_to_a_batchs_parts_merge_into_one_answer_with_the_newest_node_states() -> None:
    p0, p1, p2 = (placement(i, 10) for i in range(3))
    first = LaunchResponse(
        0,
        1,
        7,
        [p0],
        [],
        [NodeState(0, (10, 10), 5), NodeState(1, (20, 20), 5)],
        Delta(1, 0, 7, [NodeState(2, (5, 5), 3)], {"u": (1, 1)}),
    )
    second = LaunchResponse(
        0,
        1,
        7,
        [p2],
        [Rejection(p1, "node 1 has too little free", True)],
        [NodeState(1, (0, 0), 6)],
        Delta(1, 0, 7, [NodeState(2, (4, 4), 2), NodeState(3, (1, 1), 9)], {"u": (2, 2)}),
    )
    merged = _merged([first, second])
    assert (merged.gm, merged.lm, merged.seq) == (0, 1, 7)
    assert merged.accepted == [p0, p2] and [r.placement for r in merged.rejected] == [p1]
    assert sorted(merged.states) == [NodeState(0, (10, 10), 5), NodeState(1, (0, 0), 6)]
    assert sorted(merged.delta.nodes) == [NodeState(2, (5, 5), 3), NodeState(3, (1, 1), 9)]
    assert merged.delta.applied_through == 7 and merged.delta.usage == {"u": (2, 2)}


def test_no_task_a_user_may_submit_is_too_big_for_a_launch_body_on_its_own() -> None:
    """The largest command the submission model takes, in the characters JSON writes longest (a control character
    is 6 bytes: \\u0001), with the longest ids: its placement is under an eighth of the body limit. So a task is
    never refused for its size after it was accepted; splitting a batch always finds a body for it."""
    worst = "\x01" * MAX_ARG_CHARS
    args = [worst] * (MAX_RUN_CHARS // MAX_ARG_CHARS)
    task = {"driver": "exec", "command": args, "cpu_millicores": 1, "memory_mb": 1, "constraints": list(range(21))}
    job = JobSubmission.model_validate({"tasks": [task], "user": "u" * 64, "job_id": "j" * 64})
    (spec,) = job.to_tasks(f"{'u' * 64}~{'j' * 64}", ("cpu_millicores", "memory_mb"))
    body = LaunchBatchModel.core_json(
        LaunchBatch(99, 99, 10**9, [Placement(dataclasses.replace(spec, attempt=99), 99, 10**6, True, 99)])
    )
    assert len(body) > 6 * MAX_RUN_CHARS and len(body) < MAX_BODY_BYTES // 8


@pytest.mark.asyncio
async def test_a_command_over_the_limit_is_refused_at_submission_naming_the_field() -> None:
    cluster = ClusterSpec(((PartitionSpec(0, 0, ((2000, 4096),), (0,)),),))
    app = create_gm(GMSettings(lm_urls=["http://127.0.0.1:9"], lm_timeout=0.5), use_broker=False, cluster=cluster)
    task = {"driver": "exec", "command": ["/bin/true", *["x" * MAX_ARG_CHARS] * 4], "cpu_millicores": 1, "memory_mb": 1}
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://t") as gm:
        r = await gm.post("/v1/jobs", json={"tasks": [task]})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "tasks.0.command", r.text
    assert f"at most {MAX_RUN_CHARS}" in r.text


@pytest.mark.asyncio
async def test_an_lm_launches_a_big_batch_on_an_agent_in_parts_under_the_agents_limit() -> None:
    """A GM's batch part is under the limit, and an LM's launch on one agent holds some of its placements in a
    smaller envelope, so this split guards the LM's own invariant: fed a batch of 4.9 MB directly (no HTTP limit
    on the way in), the LM posts it to the agent in parts under the limit, and every task goes exactly once."""
    settings = LMSettings(expected_nodes=1, num_gms=1)
    lm = LMService(settings, None)
    posted: list[bytes] = []

    async def post(url: str, body: bytes, idempotent: bool = False) -> Reply:
        posted.append(body)
        return Reply(202, b"{}")

    lm.calls.post = post  # type: ignore[method-assign]
    try:
        registration = WorkerRegistration(
            worker_id="w", url="http://127.0.0.1:9", nodes=[NODE], drivers=["burn", "exec"]
        )
        await lm.register(registration)
        placements = [placement(i, 4 * ARG, node=0) for i in range(81)]
        response = await lm.launch(LaunchBatch(0, 0, 1, placements))
        assert len(response.accepted) == 81
        await wait_for(lambda: len(posted) == 2, 10, lambda: [len(b) for b in posted])
    finally:
        await lm.close()
    assert all(len(body) <= MAX_BODY_BYTES for body in posted)
    launched = [p.task.task_id for body in posted for p in WorkerLaunchModel.model_validate_json(body).launches]
    assert sorted(launched) == sorted(p.task.task_id for p in placements)


# ----------------------------------------------------------------------------------------- real services


TASKS_PER_USER = 40


def big_job(user: str, n: int) -> dict[str, object]:
    command = [shutil.which("true") or "/bin/true", *["a" * ARG] * 4]
    task = {"driver": "exec", "command": command, "cpu_millicores": 10, "memory_mb": 8}
    return {"job_id": f"{user}-big", "user": user, "tasks": [task] * n}


@needs_rabbitmq
def test_big_tasks_of_several_users_placed_together_all_launch_in_parts_and_none_fails(tmp_path: Path) -> None:
    """A node held by one task makes alice's and bob's big jobs and carol's small one wait; when it is stopped,
    the GM places all 81 tasks in one launch batch of about 4.9 MB, over the 4 MiB body limit. Sent in one call
    it would be refused with 413, failing every task of all three users; split, every task runs and finishes."""
    with LocalDeployment(gms=1, lms=1, workers_per_lm=1, log_dir=tmp_path / "logs") as d, d.client(30) as http:
        gm = d.gm_urls[0]
        blocker = {"driver": "exec", "command": [shutil.which("sleep") or "/bin/sleep", "600"]}
        r = http.post(
            f"{gm}/v1/jobs", json={"job_id": "hold", "tasks": [{**blocker, "cpu_millicores": 2000, "memory_mb": 8}]}
        )
        assert r.status_code == 201, r.text
        wait_until(lambda: http.get(f"{gm}/v1/jobs/hold").json()["state"] == "running", 30)
        jobs = [big_job("alice", TASKS_PER_USER), big_job("bob", TASKS_PER_USER), big_job("carol", 1)]
        for job in jobs:
            r = http.post(f"{gm}/v1/jobs", json=job)
            assert r.status_code == 201, r.text
        assert sum(len(str(job)) for job in jobs) > MAX_BODY_BYTES
        assert http.delete(f"{gm}/v1/jobs/hold").status_code == 202

        def states() -> dict[str, str]:
            return {job["job_id"]: http.get(f"{gm}/v1/jobs/{job['job_id']}").json()["state"] for job in jobs}

        wait_until(lambda: set(states().values()) <= {"finished", "failed"}, 120, states)
        assert set(states().values()) == {"finished"}, states()
        for job in jobs:
            tasks = http.get(f"{gm}/v1/jobs/{job['job_id']}").json()["tasks"]
            # Each ran once: never again after a lost worker or a preemption. Not `attempts`: it counts the GM's
            # scheduling attempts (docs/metrics.md), and the first task tried while the node was held has two.
            assert {(t["state"], t["retries"], t["preemptions"]) for t in tasks} == {("finished", 0, 0)}
        lm = http.get(f"{d.lm_urls[0]}/v1/state").json()
        assert lm["failed_launches"] == 0 and lm["launched"] == 1 + 2 * TASKS_PER_USER + 1
    gm_log = (tmp_path / "logs" / "gm-0.log").read_text()
    assert f"of {2 * TASKS_PER_USER + 1} tasks to LM 0 sent in 2 parts" in gm_log, gm_log[-3000:]
    assert "answered 413" not in gm_log + (tmp_path / "logs" / "lm-0.log").read_text()
