"""Identities and privacy at the GM (issue 21, items 4 and 7), with authentication on: a user submits as itself only
and owns every task of its job; a job id a user chooses is scoped to that user (`<user>~<id>`), so a reused id
shows nothing of another user's job or output, at the same GM or another; a GM-made id never repeats, also after
the GM restarts; a user sees its own queue only; `/metrics`, which needs no login, names no user by default.

The first tests run the GM app in this process (no LM: its launches wait for an LM that is not there); the last
ones run GMs, an LM and an agent with the exec driver as separate processes, as `megha local` does."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from pydantic import SecretStr

from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.settings import GMSettings
from megha.ctl import cli
from megha.deploy.local import LocalDeployment
from megha.services.gm.app import create_app
from megha.services.gm.job_ids import JobIds

from servicekit import needs_rabbitmq, wait_until

SECRET = "s" * 32
TOKENS = {user: f"{user}-token-{user[0] * 20}" for user in ("alice", "bob", "carol", "mallory", "ops")}
NOWHERE = "http://127.0.0.1:9"
CLUSTER = ClusterSpec(((PartitionSpec(0, 0, ((2000, 4096), (4000, 8192)), (0, 0)),),))
TASK = {"cpu_millicores": 100, "memory_mb": 10, "duration": 60}
WHOLE = {**TASK, "cpu_millicores": 4000}
"""A task only CLUSTER's second node fits: the first is placed (its launch waits for the LM), the others wait."""
GM_MADE = re.compile(r"^g0-[0-9a-z]{8,9}-\d+$")


def named(job_id: str, user: str, name: str) -> bool:
    """Whether `job_id` is the id a GM gives `user`'s job named `name`: the name in its scope, made unique."""
    return re.fullmatch(rf"{user}~{re.escape(name)}~g\d+-[0-9a-z]{{8,9}}-\d+", job_id) is not None


def field(r: httpx.Response) -> str:
    return r.json()["detail"][0]["field"]  # type: ignore[no-any-return]


@asynccontextmanager
async def gm(**values: Any) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    """A GM app with authentication on, its view of CLUSTER, and a client per user (ops is an operator; nobody
    sends no credential). Its LM is not there: placed tasks stay running, their launch retried, for the test's
    length."""
    settings = GMSettings(
        **{
            "auth": "on",
            "cluster_secret": SECRET,
            "api_tokens": SecretStr(",".join(f"{user}={token}" for user, token in TOKENS.items())),
            "operators": ["ops"],
            "lm_urls": [NOWHERE],
            "http_timeout": 1.0,
            "lm_timeout": 600.0,
            "journal_dir": "",
            **values,
        }
    )
    app = create_app(settings, use_broker=False, cluster=CLUSTER)
    async with app.router.lifespan_context(app):
        clients = {
            user: httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app),
                base_url="http://gm",
                headers={"Authorization": f"Bearer {token}"} if settings.auth == "on" else {},
            )
            for user, token in TOKENS.items()
        }
        clients["nobody"] = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gm")
        try:
            yield clients
        finally:
            for c in clients.values():
                await c.aclose()


async def submit(c: httpx.AsyncClient, **job: Any) -> httpx.Response:
    return await c.post("/v1/jobs", json={"tasks": [TASK], **job})


async def listed(c: httpx.AsyncClient, **params: str) -> list[str]:
    r = await c.get("/v1/jobs", params=params)
    assert r.status_code == 200, r.text
    return [j["job_id"] for j in r.json()["jobs"]]


# ------------------------------------------------------------------------------------------------- who submits


@pytest.mark.asyncio
async def test_a_user_submits_as_itself_only_and_owns_every_task_of_its_job() -> None:
    async with gm() as c:
        alice, ops = c["alice"], c["ops"]
        tasks = [TASK, TASK, TASK, {**TASK, "user": "bob"}]
        r = await alice.post("/v1/jobs", json={"tasks": tasks})
        assert r.status_code == 422 and field(r) == "tasks.3.user" and "bob" in r.text, r.text
        r = await submit(alice, user="bob")
        assert r.status_code == 422 and field(r) == "user", r.text
        r = await alice.post("/v1/jobs", json={"user": "alice", "tasks": [{**TASK, "user": "ops"}, TASK]})
        assert r.status_code == 422 and field(r) == "tasks.0.user", r.text
        assert await listed(ops) == []  # nothing of it was accepted, nor charged to anyone

        r = await submit(alice)  # no user named: the caller's own, not "default"
        assert r.status_code == 201, r.text
        mine = (await alice.get(f"/v1/jobs/{r.json()['job_id']}")).json()
        assert mine["user"] == "alice"
        assert await listed(ops, user="alice") == [mine["job_id"]] and await listed(ops, user="default") == []
        r = await alice.post("/v1/jobs", json={"user": "alice", "tasks": [{**TASK, "user": "alice"}]})
        assert r.status_code == 201, r.text

        r = await ops.post("/v1/jobs", json={"user": "bob", "tasks": [TASK, {**TASK, "user": "carol"}]})
        assert r.status_code == 201, r.text  # an operator acts for every user
        assert (await ops.get(f"/v1/jobs/{r.json()['job_id']}")).json()["user"] == "bob"
        r = await submit(ops)
        assert (await ops.get(f"/v1/jobs/{r.json()['job_id']}")).json()["user"] == "default"  # as before
        r = await submit(ops, user="a/b")  # a user name goes into job ids: a safe alphabet only
        assert r.status_code == 422 and field(r) == "user", r.text


@pytest.mark.asyncio
async def test_without_authentication_a_submission_names_any_user_and_keeps_its_job_id_as_before() -> None:
    async with gm(auth="off") as c:
        anyone = c["alice"]
        job = {"job_id": "j", "user": "alice", "tasks": [TASK, {**TASK, "user": "bob"}]}
        r = await anyone.post("/v1/jobs", json=job)
        assert r.status_code == 201 and r.json()["job_id"] == "j" and r.json()["task_ids"] == ["j.0", "j.1"]
        r = await submit(anyone)
        assert (await anyone.get(f"/v1/jobs/{r.json()['job_id']}")).json()["user"] == "default"


# ------------------------------------------------------------------------------------------------------ job ids


@pytest.mark.asyncio
async def test_a_job_id_a_user_chooses_is_scoped_to_it_and_another_users_same_id_reaches_nothing_of_it() -> None:
    async with gm() as c:
        alice, bob, ops = c["alice"], c["bob"], c["ops"]
        r = await submit(alice, job_id="train-1")
        assert r.status_code == 201 and named(r.json()["job_id"], "alice", "train-1"), r.text
        alices = r.json()["job_id"]
        assert r.json()["task_ids"] == [f"{alices}.0"]
        r = await submit(bob, job_id="train-1")  # the same name: bob's own job, no 409
        assert r.status_code == 201 and named(r.json()["job_id"], "bob", "train-1"), r.text
        bobs = r.json()["job_id"]
        for again in ("train-1", "alice~train-1"):
            r = await submit(alice, job_id=again)
            assert r.status_code == 409 and field(r) == "job_id", r.text
        r = await submit(bob, job_id="alice~x")  # bob cannot name a job in alice's scope
        assert r.status_code == 422 and field(r) == "job_id", r.text

        # Each user's name reaches its own job; alice's full id reaches nothing for bob (404 as for no job at all).
        assert (await alice.get("/v1/jobs/train-1")).json()["job_id"] == alices
        assert (await alice.get("/v1/jobs/alice~train-1")).json()["job_id"] == alices
        assert (await bob.get("/v1/jobs/train-1")).json()["job_id"] == bobs
        unknown = await bob.get("/v1/jobs/nothing-of-that-name")
        for path in (f"/v1/jobs/{alices}", "/v1/jobs/alice~train-1", f"/v1/jobs/{alices}/tasks/{alices}.0/logs"):
            hidden = await bob.get(path)
            assert hidden.status_code == 404 == unknown.status_code and field(hidden) == "job_id", hidden.text
            assert "alice" not in hidden.json()["detail"][0]["message"].replace(alices, "").replace("alice~", "")
        r = await bob.get(f"/v1/jobs/train-1/tasks/{alices}.0/logs")  # bob's own job has no such task
        assert r.status_code == 404 and field(r) == "task_id", r.text
        r = await bob.delete(f"/v1/jobs/{alices}")
        assert r.status_code == 404, r.text
        assert (await alice.get("/v1/jobs/train-1")).json()["state"] != "cancelled"
        assert await listed(bob) == [bobs]

        # An operator sees every job by its full id; it names jobs in the shared scope, or in a user's.
        assert (await ops.get(f"/v1/jobs/{alices}")).status_code == 200
        assert (await ops.get("/v1/jobs/train-1")).status_code == 404  # no operator's job of that name
        r = await submit(ops, job_id="train-1", user="carol")
        assert r.status_code == 201 and r.json()["job_id"] == "train-1", r.text
        r = await submit(ops, job_id="alice~y", user="alice")
        assert r.status_code == 201 and named(r.json()["job_id"], "alice", "y"), r.text
        alices_y = r.json()["job_id"]
        r = await submit(ops, job_id="alice~z", user="bob")
        assert r.status_code == 422 and field(r) == "job_id", r.text
        assert await listed(alice) == sorted([alices, alices_y])
        assert (await alice.get("/v1/jobs/y")).json()["job_id"] == alices_y
        assert (await alice.get("/v1/jobs/train-1")).json()["job_id"] == alices  # not carol's train-1

        r = await alice.delete("/v1/jobs/train-1")
        assert r.status_code == 202 and r.json()["job_id"] == alices, r.text
        assert (await bob.get("/v1/jobs/train-1")).json()["state"] != "cancelled"
        r = await submit(alice, job_id="a~b~c")
        assert r.status_code == 422 and field(r) == "job_id", r.text


def test_gm_made_ids_start_above_every_gm_made_id_held_even_when_the_clock_went_back() -> None:
    later = JobIds(0, [], 2_000_000_000.0)
    held = [later.next(()), later.next(()), "g0-17", "g1-zzzzzzzz-3", "alice~g0-zzzzzzzzz-0", "g0-" + "z" * 20 + "-0"]
    assert held[:2] == [later.prefix + "0", later.prefix + "1"] and GM_MADE.match(held[0])
    earlier = JobIds(0, held, 1_000_000_000.0)  # a restart on a clock set back; the journal holds the ids above
    fresh = [earlier.next(()) for _ in range(3)]
    assert not set(fresh) & set(held) and earlier.prefix > later.prefix and all(GM_MADE.match(i) for i in fresh)
    assert earlier.next({earlier.prefix + "3"}) == earlier.prefix + "4"  # an operator took one: skipped


@pytest.mark.asyncio
async def test_a_gm_made_id_does_not_repeat_when_the_gm_starts_again_with_an_empty_journal() -> None:
    made: list[str] = []
    for _ in range(2):  # a GM given its cluster recovers nothing: as a GM whose journal is empty
        async with gm() as c:
            for user in ("alice", "bob"):
                r = await submit(c[user])
                assert r.status_code == 201, r.text
                made.append(r.json()["job_id"])
    assert len(set(made)) == 4 and all(GM_MADE.match(i) for i in made), made


# ------------------------------------------------------------------------------------------------------ privacy


@pytest.mark.asyncio
async def test_a_user_sees_its_own_queue_only_and_an_operator_every_one() -> None:
    async with gm(queues="alice:0.4:0,bob:0.4:0") as c:
        for user, tasks in (("alice", 3), ("bob", 1)):  # alice: one placed, two waiting; bob: one waiting
            r = await c[user].post("/v1/jobs", json={"tasks": [WHOLE] * tasks})
            assert r.status_code == 201, r.text
        everything = (await c["ops"].get("/v1/queues")).json()
        assert [q["user"] for q in everything["queues"]] == ["alice", "bob"]
        assert everything["tasks"] == {"alice": {"pending": 2, "running": 0}, "bob": {"pending": 1, "running": 0}}
        for user, other in (("alice", "bob"), ("bob", "alice")):
            r = await c[user].get("/v1/queues")
            assert r.status_code == 200, r.text
            seen = r.json()
            assert [q["user"] for q in seen["queues"]] == [user] and seen["fair_scheduling"]
            assert seen["tasks"] == {user: everything["tasks"][user]}
            assert other not in r.text
        r = await submit(c["carol"])  # no queue: refused without naming the users that have one
        assert r.status_code == 422 and field(r) == "user" and "alice" not in r.text and "bob" not in r.text, r.text
    async with gm() as c:  # without fair scheduling no queue is a user's: the one queue `default` is the operators'
        assert (await c["alice"].post("/v1/jobs", json={"tasks": [WHOLE] * 2})).status_code == 201
        mine = (await c["alice"].get("/v1/queues")).json()
        assert (mine["queues"], mine["tasks"], mine["fair_scheduling"]) == ([], {}, False)
        assert (await c["ops"].get("/v1/queues")).json()["tasks"] == {"default": {"pending": 1, "running": 0}}


def queue_samples(text: str) -> dict[tuple[str, str], float]:
    """(metric, queue label) -> value of every sample with a queue label."""
    found = {}
    for line in text.splitlines():
        m = re.match(r'^(megha_\w+)\{[^}]*queue="([^"]*)"[^}]*\} (\S+)$', line)
        if m and "resource=" not in line:
            found[m.group(1), m.group(2)] = float(m.group(3))
    return found


@pytest.mark.asyncio
async def test_metrics_name_no_user_unless_configured() -> None:
    for user_labels in (False, True):
        async with gm(queues="alice:0.4:0,bob:0.4:0", metrics_user_labels=user_labels) as c:
            assert (await c["alice"].post("/v1/jobs", json={"tasks": [WHOLE] * 3})).status_code == 201
            r = await c["nobody"].get("/metrics")
            assert r.status_code == 200
            samples = queue_samples(r.text)
            first, second = ("alice", "bob") if user_labels else ("#1", "#2")
            assert samples[("megha_gm_pending_tasks", first)] == 2
            assert samples[("megha_gm_pending_tasks", second)] == 0
            assert samples[("megha_queue_share", first)] == samples[("megha_queue_share", second)] == 0.4
            assert {queue for _, queue in samples} == {first, second}
            assert ("alice" in r.text) == ("bob" in r.text) == user_labels, r.text


# -------------------------------------------------------------------------------------- separate processes


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    """Two GMs, one LM, one agent (one node) offering exec (its task output in this test's folder); users alice and
    mallory."""
    here = tmp_path_factory.mktemp("identities")
    with LocalDeployment(
        gms=2,
        lms=1,
        workers_per_lm=1,
        user_tokens={user: TOKENS[user] for user in ("alice", "mallory")},
        worker_settings={"worker-0-0": {"drivers": "burn,exec", "task_log_dir": here / "output"}},
        log_dir=here / "logs",
    ) as deployment:
        yield deployment


def as_user(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[user]}"}


def echo(text: str, job_id: str) -> dict[str, object]:
    """A job of one exec task that prints `text` (built by the shell, so the command does not hold it)."""
    half = len(text) // 2
    task = {"driver": "exec", "command": ["sh", "-c", f"echo {text[:half]}''{text[half:]}"]}
    return {"job_id": job_id, "tasks": [{**task, "cpu_millicores": 100, "memory_mb": 32}]}


@needs_rabbitmq
def test_a_reused_job_id_shows_nothing_of_another_users_job_or_output_at_the_same_gm_or_another(
    deployment: LocalDeployment,
) -> None:
    gm0, gm1 = deployment.gm_urls
    alice, mallory = as_user("alice"), as_user("mallory")

    def job(url: str, job_id: str, who: dict[str, str]) -> dict[str, Any]:
        r = httpx.get(f"{url}/v1/jobs/{job_id}", headers=who, timeout=5)
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    def output(url: str, job_id: str, task_id: str, who: dict[str, str]) -> httpx.Response:
        return httpx.get(f"{url}/v1/jobs/{job_id}/tasks/{task_id}/logs", headers=who, timeout=10)

    def finished(url: str, job_id: str, who: dict[str, str]) -> None:
        wait_until(lambda: job(url, job_id, who)["state"] == "finished", 60, lambda: job(url, job_id, who))

    # alice's train-1 at GM 0 and train-2 at GM 1 run and end first; then mallory chooses the same names, both at
    # GM 0: train-1 at the GM that holds alice's, train-2 at another GM than alice's.
    for url, name in ((gm0, "train-1"), (gm1, "train-2")):
        r = httpx.post(f"{url}/v1/jobs", json=echo(f"alice-secret-{name}", name), headers=alice, timeout=10)
        assert r.status_code == 201 and named(r.json()["job_id"], "alice", name), r.text
        finished(url, name, alice)
    for name in ("train-1", "train-2"):
        r = httpx.post(f"{gm0}/v1/jobs", json=echo(f"mallory-{name}", name), headers=mallory, timeout=10)
        assert r.status_code == 201 and named(r.json()["job_id"], "mallory", name), r.text
        finished(gm0, name, mallory)  # neither hidden by alice's ended run of the same name
    # alice's own train-2 again, at the GM that does not hold the first: another job, which runs (its runs are
    # not taken for repeats of the first's at the LM and the agent).
    r = httpx.post(f"{gm0}/v1/jobs", json=echo("alice-again", "train-2"), headers=alice, timeout=10)
    assert r.status_code == 201 and named(r.json()["job_id"], "alice", "train-2"), r.text
    finished(gm0, "train-2", alice)
    assert output(gm0, "train-2", "train-2.0", alice).text == "alice-again\n"

    for name in ("train-1", "train-2"):
        for url in (gm0, gm1):
            seen = httpx.get(f"{url}/v1/jobs/{name}", headers=mallory, timeout=5)
            assert seen.status_code == 404 or seen.json()["user"] == "mallory", seen.text
            for job_id, task_id in ((name, f"{name}.0"), (f"alice~{name}", f"alice~{name}.0")):  # alice's names
                r = output(url, job_id, task_id, mallory)
                assert "alice-secret" not in r.text, (url, job_id, r.text)
                assert r.status_code == 404 or r.text == f"mallory-{name}\n", (url, job_id, r.text)
            assert httpx.get(f"{url}/v1/jobs/alice~{name}", headers=mallory, timeout=5).status_code == 404
        assert output(gm0, name, f"{name}.0", mallory).text == f"mallory-{name}\n"  # its own, by the name it chose
        listed = httpx.get(f"{gm0}/v1/jobs", headers=mallory, timeout=5).json()["jobs"]
        assert {j["user"] for j in listed} == {"mallory"}
    # alice's output is hers still, at the GM that holds each job.
    for url, name in ((gm0, "train-1"), (gm1, "train-2")):
        r = output(url, name, f"{name}.0", alice)
        assert (r.status_code == 200 and r.text == f"alice-secret-{name}\n") or (url, name) == (gm0, "train-2"), r.text


@needs_rabbitmq
def test_a_gm_made_id_does_not_repeat_after_the_gm_restarts_from_its_journal_or_without_one(tmp_path: Path) -> None:
    """Killed and started again, the GM recovers its jobs from its journal and makes ids none of them has; killed
    again and started with its journal gone, it holds none of the ids it made, and still makes none again (a
    counter started afresh would)."""
    alice = as_user("alice")
    burn = {"tasks": [{"duration": 0.05, "cpu_millicores": 100, "memory_mb": 16}]}
    with LocalDeployment(
        gms=1,
        lms=1,
        workers_per_lm=1,
        execution="simulated",
        user_tokens={"alice": TOKENS["alice"]},
        log_dir=tmp_path / "logs",
    ) as deployment:
        gm0 = deployment.gm_urls[0]
        journal = tmp_path / "journal" / f"{deployment.run_id}.gm-0.journal"

        def held() -> list[str]:
            return [j["job_id"] for j in httpx.get(f"{gm0}/v1/jobs", headers=alice, timeout=5).json()["jobs"]]

        def made() -> list[str]:
            ids = []
            for _ in range(3):
                r = httpx.post(f"{gm0}/v1/jobs", json=burn, headers=alice, timeout=10)
                assert r.status_code == 201, r.text
                ids.append(r.json()["job_id"])
            return ids

        def restart(keep_journal: bool) -> None:
            deployment.kill("gm-0")
            assert journal.exists()
            if not keep_journal:
                journal.unlink()
            deployment.restart("gm-0")
            deployment.wait_healthy()

        first = made()
        restart(keep_journal=True)
        assert held() == first
        second = made()
        restart(keep_journal=False)
        assert held() == []
        third = made()
    seen = first + second + third
    assert len(set(seen)) == len(seen) == 9 and all(GM_MADE.match(i) for i in seen), seen


@needs_rabbitmq
def test_the_cli_with_a_users_token_reads_its_own_queue_and_its_jobs_by_the_names_it_chose(
    deployment: LocalDeployment,
) -> None:
    """`megha queues` reads GET /v1/queues (not /metrics) and a user may run it; `megha job status` and `job logs`
    take the name the user chose, and `--task` its task's number or `<name>.<i>`."""
    gm0 = deployment.gm_urls[0]

    def megha(*args: str) -> str:
        env = {"COLUMNS": "200", "MEGHA_GM_URL": gm0, "MEGHA_GM_URLS": "", "MEGHA_API_TOKEN": TOKENS["alice"]}
        result = CliRunner().invoke(cli, list(args), env=env)
        assert result.exit_code == 0, (args, result.output, result.exception)
        return result.output

    accepted = json.loads(megha("job", "submit", "--tasks", "1", "--duration", "0.05", "--job-id", "cli-1", "--json"))
    assert named(accepted["job_id"], "alice", "cli-1"), accepted
    wait_until(lambda: json.loads(megha("job", "status", "cli-1", "--json"))["state"] == "finished", 60)
    (answer,) = json.loads(megha("queues", "--json"))
    assert answer["state"] is None and answer["tasks"] == {} and answer["queues"]["queues"] == []  # no fair scheduling
    assert accepted["job_id"] in megha("job", "status", "cli-1")
    r = httpx.post(f"{gm0}/v1/jobs", json=echo("alice-cli-output", "cli-2"), headers=as_user("alice"), timeout=10)
    assert r.status_code == 201, r.text
    wait_until(lambda: json.loads(megha("job", "status", "cli-2", "--json"))["state"] == "finished", 60)
    for task in ("0", "cli-2.0", "alice~cli-2.0"):
        assert megha("job", "logs", "cli-2", "--task", task) == "alice-cli-output\n", task
