"""Recovery through separate OS processes and a real RabbitMQ: an LM killed (SIGKILL) mid-replay and restarted
rebuilds its cluster from its agents, and a broker killed mid-replay and restarted loses nothing."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx

from megha.deploy.broker_node import broker_node
from megha.deploy.local import LocalDeployment

from faultkit import BACKLOG, assert_nothing_lost, backlog_deployment, replay_with_fault, service_state
from servicekit import api, needs_rabbitmq, wait_until

pytestmark = needs_rabbitmq


def test_an_lm_killed_mid_replay_and_restarted_rebuilds_from_its_agents_and_loses_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    deployment = LocalDeployment(
        gms=2, lms=2, workers_per_lm=2, log_dir=tmp_path / "logs", heartbeat_interval=0.5, worker_timeout=5.0
    )
    seen: dict[str, object] = {}

    def kill_lm_then_restart() -> None:
        url = deployment.lm_urls[0]
        wait_until(lambda: service_state(url).get("running", 0) > 0, 60, lambda: service_state(url))  # type: ignore[operator]
        before = service_state(url)
        seen["incarnation"], seen["running"] = before["incarnation"], before["running"]
        deployment.kill("lm-0")
        time.sleep(3)  # the outage (the fault, not a wait)
        deployment.restart("lm-0")
        # Its agents register again with the tasks they run; the LM is ready with a new incarnation.
        wait_until(lambda: service_state(url).get("ready") is True, 30, lambda: service_state(url))
        seen["after"] = service_state(url)

    def lm0_in_views() -> list[list[object]]:
        return [
            [p["used_fraction"] for p in service_state(url)["partitions"] if p["lm"] == 0]  # type: ignore[attr-defined, index]
            for url in deployment.gm_urls
        ]

    with deployment:
        run, states = replay_with_fault(deployment, kill_lm_then_restart)
        # The GMs took the LM out of their view while it was down (placing on the other LM) and back in once it
        # answered: its partitions are free in every GM's view again, once its last deltas (every second) arrived;
        # out of the view, they would show all used.
        wait_until(lambda: lm0_in_views() == [[0.0, 0.0]] * 2, 15, lm0_in_views)
    assert_nothing_lost(run)
    after = seen["after"]
    assert isinstance(after, dict) and after["incarnation"] > seen["incarnation"]  # type: ignore[operator]
    for state in states:
        assert state["idle"] and state["free"] == state["capacity"] and state["down_nodes"] == {}


def test_an_lm_killed_mid_replay_and_never_restarted_has_its_runs_run_elsewhere_and_loses_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An LM that never comes back: its GMs place nothing more there once a call to it fails, place again what
    never reached it, and after MEGHA_LM_LOST_AFTER run its runs again on the other LM (docs/reliability.md)."""
    deployment = LocalDeployment(
        gms=2,
        lms=2,
        workers_per_lm=2,
        log_dir=tmp_path / "logs",
        heartbeat_interval=0.5,
        gm_settings={"lm_lost_after": 5},
    )

    def kill_lm() -> None:
        url = deployment.lm_urls[0]
        wait_until(lambda: service_state(url).get("running", 0) > 0, 60, lambda: service_state(url))  # type: ignore[operator]
        deployment.kill("lm-0")
        deployment.kill("worker-0-0")
        deployment.kill("worker-0-1")  # its runs go with it (an agent left alone would run them to their end)

    with deployment:
        run, [lm1] = replay_with_fault(deployment, kill_lm, gone=frozenset({0}))
        gm_logs = "".join(p.log.read_text() for p in deployment.processes if p.name.startswith("gm-"))
    assert_nothing_lost(run)
    assert "LM 0 unreachable" in gm_logs and "are given up" in gm_logs
    assert lm1["idle"] and lm1["free"] == lm1["capacity"]


def test_a_gm_killed_with_tasks_queued_and_restarted_recovers_its_jobs_from_its_journal(tmp_path) -> None:  # type: ignore[no-untyped-def]
    deployment = backlog_deployment(tmp_path / "logs")
    seen: dict[str, object] = {}

    def kill_gm_with_a_queue_then_restart() -> None:
        url = deployment.gm_urls[0]

        def with_a_queue() -> dict[str, object] | None:
            state = service_state(url)
            queued = int(state.get("queued", 0)) + int(state.get("waiting", 0))  # type: ignore[call-overload]
            return state if queued > 0 and int(state.get("running", 0)) > 0 else None  # type: ignore[call-overload]

        seen["before"] = wait_until(with_a_queue, 60, lambda: service_state(url))  # the state the kill met
        deployment.kill("gm-0")
        time.sleep(3)  # the outage (the fault, not a wait)
        deployment.restart("gm-0")
        wait_until(lambda: "gm" in service_state(url), 60, lambda: service_state(url))
        seen["after"] = service_state(url)

    with deployment:
        run, states = replay_with_fault(deployment, kill_gm_with_a_queue_then_restart, BACKLOG)
        jobs_at_gm0 = [j for j in run.jobs.values() if j.gm == 0]
        statuses = [api.get(f"{deployment.gm_urls[0]}/v1/jobs/{j.job_id}", timeout=5.0) for j in jobs_at_gm0]
    assert_nothing_lost(run, 78)
    before = seen["before"]
    assert isinstance(before, dict) and before["queued"] + before["waiting"] > 0  # tasks were queued at the kill
    # The restarted GM knows every job it had accepted, each task finished once.
    assert jobs_at_gm0 and all(r.status_code == 200 for r in statuses)
    assert all(t["state"] == "finished" for r in statuses for t in r.json()["tasks"])
    for state in states:
        assert state["idle"] and state["free"] == state["capacity"]


def one_gm_lm_and_agent(tmp_path: Path) -> LocalDeployment:
    """One GM, one LM and one agent of one node, agents heard every 0.5 s and lost after 5 s."""
    return LocalDeployment(
        gms=1, lms=1, workers_per_lm=1, log_dir=tmp_path / "logs", heartbeat_interval=0.5, worker_timeout=5.0
    )


def a_running_task(deployment: LocalDeployment, duration: float) -> str:
    """Submit one task of `duration` seconds to GM 0 and wait until it runs; its job's URL."""
    api.use(deployment)
    gm = deployment.gm_urls[0]
    r = api.post(f"{gm}/v1/jobs", json={"tasks": [{"duration": duration, "cpu_millicores": 100, "memory_mb": 16}]})
    assert r.status_code == 201, r.text
    url = f"{gm}/v1/jobs/{r.json()['job_id']}"
    wait_until(lambda: api.get(url, timeout=5).json()["state"] == "running", 30, lambda: api.get(url).json())
    return url


def test_a_gm_restarted_after_its_lm_counts_the_completion_that_waited_for_it_and_runs_nothing_twice(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A run ends while its GM is down: its completion waits in the GM's queue. Its LM then restarts, and so knows
    the run no more. The GM, restarted after it, reads the completions that waited for it before it plans its
    recovery: the task counts as running, the completion ends it, and nothing is launched again (before, the GM
    launched the task again, which then ran and ended twice: found by `megha chaos --faults all-kill`)."""
    deployment = one_gm_lm_and_agent(tmp_path)
    with deployment:
        gm, lm = deployment.gm_urls[0], deployment.lm_urls[0]
        url = a_running_task(deployment, 2.0)
        deployment.kill("gm-0")
        wait_until(lambda: service_state(lm).get("running") == 0, 30, lambda: service_state(lm))  # its run ended
        deployment.kill("lm-0")
        deployment.restart("lm-0")
        wait_until(lambda: service_state(lm).get("ready") is True, 30, lambda: service_state(lm))
        deployment.restart("gm-0")
        wait_until(lambda: "gm" in service_state(gm), 60, lambda: service_state(gm))
        job = wait_until(lambda: (s := api.get(url, timeout=5).json())["state"] == "finished" and s, 30, lambda: url)
        launched = service_state(lm)["launched"]
        gm_log = deployment.process("gm-0").log.read_text()
    assert launched == 0, gm_log  # the restarted LM launched nothing: the task ran once
    assert [t["state"] for t in job["tasks"]] == ["finished"]
    assert "1 completions waited for it (1 runs)" in gm_log


def test_a_run_that_ended_while_its_lm_and_gm_were_down_is_not_run_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A run ends while its LM and its GM are both down: its agent's report waits in the LM's queue. The GM starts
    again first and claims the LM as soon as the LM is ready; the LM reads the reports that waited for it before it
    answers, so the GM learns that the run ended and launches nothing again (before, the claim found the run
    neither running nor ended here, and the GM launched it again: it ran twice)."""
    deployment = one_gm_lm_and_agent(tmp_path)
    with deployment:
        gm, lm = deployment.gm_urls[0], deployment.lm_urls[0]
        url = a_running_task(deployment, 1.5)
        deployment.kill("gm-0")
        deployment.kill("lm-0")
        time.sleep(3)  # the outage (the fault, not a wait): the run ends meanwhile, its report waits for the LM
        deployment.restart("gm-0")  # it waits for its LM (MEGHA_LM_TIMEOUT), then claims it at once
        deployment.restart("lm-0")
        wait_until(lambda: "gm" in service_state(gm), 60, lambda: service_state(gm))
        job = wait_until(lambda: (s := api.get(url, timeout=5).json())["state"] == "finished" and s, 30, lambda: url)
        time.sleep(2)  # a launch of the task again would have reached the LM by now
        launched = service_state(lm)["launched"]
        logs = "".join(p.log.read_text() for p in deployment.processes)
    assert launched == 0, logs  # the restarted LM launched nothing: the task ran once
    assert [t["state"] for t in job["tasks"]] == ["finished"]


def test_a_job_sent_to_an_agent_that_is_down_for_a_few_seconds_waits_for_it_and_finishes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The only agent is killed and started again 4 s later, within MEGHA_WORKER_TIMEOUT; a job submitted meanwhile
    is launched to it, refused at the door. The LM takes the agent out of service at once (it fails its health
    check too), and its tasks wait for it rather than spending their attempts on it: the job finishes (an outside
    audit: the GM placed them on the dead agent three times in 1.5 s, and the job failed)."""
    deployment = one_gm_lm_and_agent(tmp_path)
    with deployment:
        api.use(deployment)
        gm = deployment.gm_urls[0]
        deployment.kill("worker-0-0")
        r = api.post(f"{gm}/v1/jobs", json={"tasks": [{"duration": 1.0, "cpu_millicores": 100, "memory_mb": 16}] * 2})
        assert r.status_code == 201, r.text
        url = f"{gm}/v1/jobs/{r.json()['job_id']}"
        wait_until(lambda: "taken out of service" in deployment.process("lm-0").log.read_text(), 30, lambda: url)
        time.sleep(4)  # the outage (the fault, not a wait)
        deployment.restart("worker-0-0")
        ended = ("finished", "failed", "cancelled")
        job = wait_until(lambda: (s := api.get(url, timeout=5).json())["state"] in ended and s, 60, lambda: url)
        lm_log = deployment.process("lm-0").log.read_text()
    assert job["state"] == "finished", (job, lm_log)
    assert "which does not answer: out of service" in lm_log


def test_a_broker_killed_mid_replay_and_restarted_loses_nothing() -> None:
    with broker_node() as node:
        deployment = LocalDeployment(gms=2, lms=2, workers_per_lm=2, amqp_url=node.url, heartbeat_interval=0.5)

        def kill_broker_then_restart() -> None:
            url = deployment.lm_urls[0]
            wait_until(lambda: service_state(url).get("running", 0) > 0, 60, lambda: service_state(url))  # type: ignore[operator]
            node.kill()
            time.sleep(5)  # the outage (the fault, not a wait)
            node.start()

        with deployment:
            run, states = replay_with_fault(deployment, kill_broker_then_restart)
    assert_nothing_lost(run)
    for state in states:
        assert state["idle"] and state["free"] == state["capacity"]


def test_an_agent_lost_while_its_lm_was_down_has_its_tasks_run_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An agent that restarts without its tasks while its LM is down: the rebuilt LM does not hold those runs, and
    once it tells the GMs it was rebuilt they run them again (each finished once)."""
    deployment = backlog_deployment(tmp_path / "logs", worker_timeout=5.0)

    def lose_an_agent_while_its_lm_is_down() -> None:
        url = deployment.lm_urls[0]
        wait_until(lambda: service_state(url).get("running", 0) > 0, 60, lambda: service_state(url))  # type: ignore[operator]
        deployment.kill("lm-0")
        deployment.kill("worker-0-0")  # its simulated runs are gone with it
        deployment.restart("worker-0-0")  # it waits for its LM, then registers again with nothing running
        time.sleep(1)  # the LM stays down a while longer (the fault, not a wait)
        deployment.restart("lm-0")
        wait_until(lambda: service_state(url).get("ready") is True, 30, lambda: service_state(url))

    with deployment:
        run, states = replay_with_fault(deployment, lose_an_agent_while_its_lm_is_down, BACKLOG)
        gm_logs = "".join(p.log.read_text() for p in deployment.processes if p.name.startswith("gm-"))
    assert_nothing_lost(run, 78)
    assert "came back without" in gm_logs  # the GMs learnt of runs the rebuilt LM did not hold
    for state in states:
        assert state["idle"] and state["free"] == state["capacity"]


def test_an_lm_restarted_with_another_num_gms_stays_out_of_the_gms_views_until_it_runs_as_before(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An LM restarted with another MEGHA_NUM_GMS has its nodes in other partitions than the GMs place by: every
    task a GM placed there would fail (`repartition flag is wrong`). Each GM finds the LM's new incarnation, compares
    its layout, logs one ERROR line naming the setting and places nothing there: a job's tasks all run on the other
    LM. Restarted with its earlier settings, it is back in both views."""
    deployment = LocalDeployment(gms=2, lms=2, workers_per_lm=2, log_dir=tmp_path / "logs", worker_timeout=5.0)

    def gm_logs() -> str:
        return "".join(p.log.read_text() for p in deployment.processes if p.name.startswith("gm-"))

    def lm0_in_views() -> list[list[object]]:
        return [
            [p["used_fraction"] for p in service_state(url)["partitions"] if p["lm"] == 0]  # type: ignore[attr-defined, index]
            for url in deployment.gm_urls
        ]

    def restart_lm0(num_gms: int) -> None:
        deployment.kill("lm-0")
        deployment.process("lm-0").env["MEGHA_NUM_GMS"] = str(num_gms)
        deployment.restart("lm-0")

    with deployment:
        api.use(deployment)
        restart_lm0(3)
        wait_until(lambda: gm_logs().count("LM 0 restarted with another layout") == 2, 30, gm_logs)
        assert lm0_in_views() == [[1.0, 1.0]] * 2  # nothing free there, in either GM's view
        metrics = httpx.get(f"{deployment.gm_urls[0]}/metrics", timeout=5).text
        assert 'megha_gm_lms_with_other_layout{gm="0"} 1.0' in metrics
        body = {"tasks": [{"duration": 0.2, "cpu_millicores": 100, "memory_mb": 16}] * 12}
        r = api.post(f"{deployment.gm_urls[0]}/v1/jobs", json=body, timeout=10)
        assert r.status_code == 201, r.text
        url = f"{deployment.gm_urls[0]}/v1/jobs/{r.json()['job_id']}"
        ended = ("finished", "failed", "cancelled")
        job = wait_until(lambda: (s := api.get(url, timeout=5).json())["state"] in ended and s, 30, url)
        restart_lm0(2)
        wait_until(lambda: gm_logs().count("runs with the layout this GM places by again") == 2, 30, gm_logs)
        wait_until(lambda: lm0_in_views() == [[0.0, 0.0]] * 2, 15, lm0_in_views)
        logs = gm_logs()
    assert job["state"] == "finished" and {t["lm"] for t in job["tasks"]} == {1}, job
    assert "it has a partition for 3 GMs (its MEGHA_NUM_GMS), this GM's view of it 2" in logs
    assert "repartition flag is wrong" not in logs


def test_an_lm_and_an_agent_killed_together_come_back_with_the_layout_the_gm_places_by(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An LM numbers its nodes in the order its agents register. An agent killed with its LM and restarted first
    would take the first free numbers, the other agent's (which claims them again when it sees the LM's new
    incarnation, and gets the next ones): with unlike nodes the LM then runs with another layout than its GM places
    by, and the GM keeps it out of its view until it restarts. The agent keeps its numbers in a file and claims them
    again: the layout is the same, the GM takes the LM back and a job placed afterwards runs there."""
    deployment = LocalDeployment(
        gms=1,
        lms=1,
        workers_per_lm=2,
        log_dir=tmp_path / "logs",
        worker_timeout=5.0,
        worker_settings={"worker-0-1": {"node_cpu_millicores": 3000}},  # unlike nodes: a swap changes the layout
    )

    def log_of(name: str) -> str:
        return deployment.process(name).log.read_text()

    def nodes_of(name: str) -> list[str]:
        return re.findall(r"registered with LM 0 \(incarnation \d+\) as nodes (\d+)\.\.", log_of(name))

    with deployment:
        api.use(deployment)
        agents = ("worker-0-0", "worker-0-1")
        wait_until(lambda: all(nodes_of(name) for name in agents), 10, lambda: [nodes_of(name) for name in agents])
        second = next(name for name in agents if nodes_of(name) == ["1"])
        deployment.kill("lm-0")
        deployment.kill(second)
        deployment.restart(second)  # registers as soon as the LM answers, before the other agent sees it restarted
        time.sleep(1)
        deployment.restart("lm-0")
        checked = re.compile(r"LM 0 restarted (\(incarnation \d+\) with the layout|with another layout)")
        wait_until(lambda: checked.search(log_of("gm-0")), 30, lambda: log_of("gm-0"))
        assert "another layout" not in log_of("gm-0"), log_of("gm-0")
        body = {"tasks": [{"duration": 0.2, "cpu_millicores": 100, "memory_mb": 16}] * 4}
        r = api.post(f"{deployment.gm_urls[0]}/v1/jobs", json=body, timeout=10)
        assert r.status_code == 201, r.text
        url = f"{deployment.gm_urls[0]}/v1/jobs/{r.json()['job_id']}"
        ended = ("finished", "failed", "cancelled")
        job = wait_until(lambda: (s := api.get(url, timeout=5).json())["state"] in ended and s, 30, lambda: url)
        agent_log, again = log_of(second), nodes_of(second)
    assert again == ["1", "1"], agent_log  # its numbers again, after its restart
    assert job["state"] == "finished", job
