"""The GM's write-ahead journal: what is appended is replayed, a damaged tail is skipped, a rewrite keeps only
what it is given; and a GM restarting from its journal (`GMService.recover`) runs again only what neither runs nor
ended, however many finished tasks it keeps."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import stat
import time
from pathlib import Path

import pytest

from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.core.lm import LocalMaster
from megha.common.core.messages import (
    Completions,
    FinishedTask,
    LaunchBatch,
    LaunchResponse,
    Output,
    Send,
    StopRequest,
    WorkerLaunch,
    WorkerReport,
)
from megha.common.core.recovery import lm_report
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.lifecycle import StartupError
from megha.common.models import (
    CompletionsModel,
    DeltaModel,
    EndedRun,
    GMRecovery,
    JobSubmission,
    PlacementModel,
    TaskEvent,
    TaskEvents,
)
from megha.common.settings import GMSettings
from megha.loadgen.events import EventRecorder
from megha.services.gm.journal import End, Journal, NotWritten, merge_lines
from megha.services.gm.peers import ReplicaStore
from megha.services.gm.service import GMService


def test_records_are_replayed_and_a_line_cut_short_by_a_crash_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "j" / "run.gm-0.journal"
    journal = Journal(path)

    async def write() -> None:
        await asyncio.gather(
            journal.append_durably({"job": {"job_id": "a", "tasks": []}, "at": 1.0}),
            journal.append_durably({"job": {"job_id": "b", "tasks": []}, "at": 2.0}),
        )

    asyncio.run(write())
    journal.append({"end": "a.0", "state": "finished", "reason": ""})
    journal.append({"end": "b.0", "state": "failed", "reason": "LM 1 unreachable"})
    journal.close()
    with path.open("ab") as f:
        f.write(b'{"job": {"job_id": "c"')  # the crash came in the middle of a write
    replayed = Journal.replay(path)
    assert [(r["job_id"], at) for r, at in replayed.jobs] == [("a", 1.0), ("b", 2.0)]
    assert replayed.ends == {"a.0": End("finished", ""), "b.0": End("failed", "LM 1 unreachable")}
    assert replayed.damaged == 1


def test_a_rewrite_keeps_only_the_records_given_and_appends_after_them(tmp_path: Path) -> None:
    path = tmp_path / "run.gm-1.journal"
    journal = Journal(path)
    journal.append({"end": "old.0", "state": "finished", "reason": ""})
    journal.rewrite([{"job": {"job_id": "kept"}, "at": 5.0}])
    journal.append({"end": "kept.0", "state": "finished", "reason": ""})
    journal.close()
    replayed = Journal.replay(path)
    assert [r["job_id"] for r, _ in replayed.jobs] == ["kept"] and replayed.ends == {"kept.0": End("finished", "")}


def test_journals_and_their_copies_are_private_to_the_gm_s_user(tmp_path: Path) -> None:
    """A journal holds every user's commands and task environments: an exec task on the GM's host (another uid)
    may read none of it. Made, rewritten, merged into and copied at a peer, each file is 0600 and the folder made
    for it 0700; a journal an older version left readable to all is made private when it is opened."""
    folder = tmp_path / "journal"
    old = tmp_path / "old.journal"
    old.write_text('{"end": "x.0", "state": "finished", "reason": ""}\n')
    old.chmod(0o644)
    journal = Journal(folder / "run.gm-0.journal")
    journal.append({"end": "a.0", "state": "finished", "reason": ""})
    journal.rewrite([{"job": {"job_id": "kept"}, "at": 5.0}])
    journal.close()
    merge_lines(folder / "run.gm-1.journal", ['{"end": "b.0", "state": "finished", "reason": ""}'])
    store = ReplicaStore(folder, "run")
    asyncio.run(store.write(2, True, ['{"end": "c.0", "state": "finished", "reason": ""}']))
    asyncio.run(store.write(3, False, ['{"end": "d.0", "state": "finished", "reason": ""}']))
    Journal(old).close()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = [*folder.iterdir(), old]
    assert len(files) == 5 and {f.name for f in files} >= {"run.gm-2.copy.journal", "run.gm-3.copy.journal"}
    assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in files} == {f.name: 0o600 for f in files}


def test_a_missing_journal_replays_as_empty(tmp_path: Path) -> None:
    replayed = Journal.replay(tmp_path / "none.journal")
    assert (replayed.jobs, replayed.ends, replayed.damaged) == ([], {}, 0)


# ------------------------------------------------------------------ a GM restarting from its journal (in-process)
# The GM service runs in-process against an LM core (`LocalMaster`) that the test drives: the GM's calls to its LM
# (the claim, the launch batches) are handed to that core by hand, so the test decides what reached the LM before
# the crash. MEGHA_FINISHED_TASKS_KEPT is small, so replaying the journal's ends forgets finished jobs.

SPEC = ClusterSpec(((PartitionSpec(0, 0, ((4000, 8192),) * 3, (0, 0, 0)),),))  # one LM, one GM, three nodes


class _Life:
    """One life of GM 0 with its journal in `journal_dir`, and what it sent its LM."""

    def __init__(self, journal_dir: Path, kept: int, lm: LocalMaster, broker: object = None) -> None:
        settings = GMSettings(
            lm_urls=["http://127.0.0.1:9"], journal_dir=str(journal_dir), run_id="t", finished_tasks_kept=kept
        )
        self.service = GMService(settings, broker)  # type: ignore[arg-type]
        self.service.adopt(SPEC)
        self.lm = lm
        self.sent: list[Output] = []
        self.service.dispatch.send = self.sent.extend  # type: ignore[method-assign]

        async def claim() -> list[GMRecovery]:
            report = lm_report(lm, 0)
            return [
                GMRecovery(
                    lm=0,
                    incarnation=0,
                    delta=DeltaModel.plain(report.delta),
                    running=[PlacementModel.plain(p) for p in report.running],
                    ended=[EndedRun.plain(run) for run in report.ended],
                )
            ]

        self.service.restart.claim = claim  # type: ignore[method-assign]

    def batches(self) -> list[LaunchBatch]:
        """The launch batches sent since the last call."""
        sent, self.sent[:] = list(self.sent), []
        return [o.msg for o in sent if isinstance(o, Send) and isinstance(o.msg, LaunchBatch)]

    def launch(self, batches: list[LaunchBatch]) -> dict[str, int]:
        """The LM gets `batches`, and the GM its answers; returns the node of each task launched."""
        nodes: dict[str, int] = {}
        core = self.service.core
        assert core is not None
        for batch in batches:
            for out in self.lm.handle(batch, time.time()):
                if isinstance(out.msg, LaunchResponse):
                    core.handle(out.msg, time.time())
                elif isinstance(out.msg, WorkerLaunch):
                    nodes |= {p.task.task_id: p.node for p in out.msg.launches}
        return nodes

    def finish(self, task_id: str, node: int) -> None:
        """The task's run ends on its worker: the LM reports it, the GM gets the completion."""
        core = self.service.core
        assert core is not None
        for out in self.lm.handle(WorkerReport(0, [FinishedTask(task_id, node, gm=0)]), time.time()):
            if isinstance(out.msg, Completions):
                core.handle(out.msg, time.time())

    async def submit(self, job_id: str, tasks: int = 1, user: str = "default") -> None:
        """Submit as the GM's route does: the body validated, then named with `job_id` (an id the GM may have
        made, which no client could submit)."""
        task = {"duration": 60.0, "cpu_millicores": 500, "memory_mb": 256}
        sub = JobSubmission.model_validate({"user": user, "tasks": [task] * tasks})
        await self.service.submit(sub.model_copy(update={"job_id": job_id}), time.time())


def _ends(path: Path) -> list[str]:
    """The task ids of the journal's end records, in order, repeats included."""
    return [r["end"] for r in map(json.loads, path.read_text().splitlines()) if "end" in r]


def test_a_submission_written_before_its_gm_was_fenced_is_accepted_and_recovered(tmp_path: Path) -> None:
    """A GM fenced after a stall resets (closing its journal) while a submission waits for its journal's sync. The
    line was written, so the recovery that follows reads the job: the submission is answered as accepted, not with
    the closed file's error (a 500, as in a CI run) nor a 503 (the client's next try would get 409 for its own
    job, and count it refused)."""
    lm = LocalMaster(0, SPEC.partitions[0])

    async def life() -> None:
        gm = _Life(tmp_path, 10, lm)
        await gm.service.recover()
        submitting = asyncio.get_running_loop().create_task(gm.submit("late"))
        await asyncio.sleep(0)  # written, its sync not yet done
        gm.service.reset()  # fenced: the journal closes, the identity is recovered again
        await submitting
        await gm.service.recover()
        assert "late" in gm.service.jobs.jobs

    asyncio.run(life())


def test_a_gm_restarting_from_a_journal_with_a_job_a_user_named_recovers_it(tmp_path: Path) -> None:
    """A job a user named gets the id `<user>~<name>~<made>` from its GM, and the journal keeps that id. A GM
    restarting from such a journal recovers the job and runs it. Before the fix its recovery refused the id (a
    client may not submit one with two scopes) and the GM could not start again, ever."""
    lm = LocalMaster(0, SPEC.partitions[0])
    named = "alice~prep~g0-mx15y5cq-0"

    async def lives() -> None:
        first = _Life(tmp_path, 10, lm)
        await first.service.recover()
        await first.submit(named, user="alice")
        assert first.service.journal is not None
        first.service.journal.close()  # the crash: the launch never reached the LM

        second = _Life(tmp_path, 10, lm)
        await second.service.recover()
        job = second.service.jobs.status(named)
        assert job is not None and job.user == "alice"
        assert [p.task.task_id for b in second.batches() for p in b.placements] == [f"{named}.0"]
        assert second.service.journal is not None
        second.service.journal.close()

    asyncio.run(lives())


@pytest.mark.parametrize("where", ["a-file", "a-file/below"])
def test_a_journal_folder_that_cannot_be_used_stops_the_gm_in_one_line_naming_the_variable(
    tmp_path: Path, where: str
) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    gm = _Life(tmp_path / where, 10, LocalMaster(0, SPEC.partitions[0]))
    with pytest.raises(StartupError, match=f"MEGHA_JOURNAL_DIR={tmp_path / where}: cannot keep the journal"):
        asyncio.run(gm.service.recover())


def test_a_record_not_written_says_so(tmp_path: Path) -> None:
    """A closed journal writes nothing: NotWritten, which a submission answers with 503 (submit again)."""
    journal = Journal(tmp_path / "run.gm-0.journal")
    journal.close()
    with pytest.raises(NotWritten):
        asyncio.run(journal.append_durably({"job": {"job_id": "a", "tasks": []}, "at": 1.0}))
    assert Journal.replay(journal.path).jobs == []


@pytest.mark.parametrize("kept", [0, 1])
def test_a_gm_restarting_from_a_journal_with_more_finished_tasks_than_it_keeps_loses_nothing(
    tmp_path: Path, kept: int
) -> None:
    """Replaying the ends forgets finished jobs beyond MEGHA_FINISHED_TASKS_KEPT, as the GM did when they ended:
    recovery goes on, runs again only what neither runs nor ended, adopts what runs, and ends nothing twice.
    Before the fix it failed with a KeyError on the tasks of the first job forgotten."""
    lm = LocalMaster(0, SPEC.partitions[0], ended_runs_kept=100)  # a restarting GM learns which runs ended

    async def lives() -> None:
        first = _Life(tmp_path, kept, lm)
        await first.service.recover()  # a GM's start: nothing journaled yet
        for job_id, tasks in (("done-1", 1), ("done-2", 1), ("half", 2)):
            await first.submit(job_id, tasks)
        nodes = first.launch(first.batches())
        assert sorted(nodes) == ["done-1.0", "done-2.0", "half.0", "half.1"]
        for task_id in ("done-1.0", "done-2.0", "half.0"):
            first.finish(task_id, nodes[task_id])
        assert "done-1" not in first.service.jobs.jobs  # forgotten: more than `kept` finished tasks were held
        await first.submit("late")  # its launch is lost in the crash: the LM never hears of it
        await first.submit("dropped")  # the same, and cancelled: the crash came once the cancel was durable
        assert sorted(p.task.task_id for b in first.batches() for p in b.placements) == ["dropped.0", "late.0"]
        assert first.service.journal is not None
        await first.service.journal.append_durably({"cancel": "dropped", "at": time.time()})  # cancel()'s 1st step
        first.service.journal.close()  # the crash
        path = first.service.journal_path()
        assert _ends(path) == ["done-1.0", "done-2.0", "half.0"]

        second = _Life(tmp_path, kept, lm)
        await second.service.recover()
        jobs, core = second.service.jobs, second.service.core
        assert core is not None
        assert not [o for o in second.sent if isinstance(o.msg, StopRequest)]  # no run of `dropped` to stop
        batches = second.batches()
        assert [p.task.task_id for b in batches for p in b.placements] == ["late.0"]  # nothing that ran or ended
        assert set(core.running) == {"half.1"}  # adopted: it runs on at the LM
        half = jobs.status("half")
        assert half is not None and [t.state for t in half.tasks] == ["finished", "launched"]
        # The only end announced now is the cancel of the task the crash left queued.
        assert [(e.task_id, e.kind) for e in jobs.ended_here] == [("dropped.0", "cancelled")]
        assert not {"done-1", "done-2"} & set(jobs.jobs)  # forgotten, as the first life would have been by now
        dropped = jobs.status("dropped")
        if kept:
            assert dropped is not None and (dropped.state, dropped.tasks[0].state) == ("cancelled", "cancelled")
        else:
            assert dropped is None  # forgotten as soon as it ended
        held = _ends(path)  # the journal rewritten to what the table holds
        assert len(held) == len(set(held)) and "half.0" in held

        # The recovered GM carries on: what ran on and what was queued again end, once each.
        nodes = second.launch(batches)
        assert list(nodes) == ["late.0"]
        second.finish("late.0", nodes["late.0"])
        second.finish("half.1", core.running["half.1"].node)
        assert _ends(path)[len(held) :] == ["late.0", "half.1"]
        assert jobs.unfinished() == 0 and core.running == {}
        assert second.service.journal is not None
        second.service.journal.close()

    asyncio.run(lives())


def test_a_completion_redelivered_to_a_restarted_gm_leaves_the_first_finish_time(tmp_path: Path) -> None:
    """A GM killed after a task finished comes back from its journal while its LM delivers the task's completion
    again (the GM had not acknowledged it): the task stays finished once, with the finish time first reported.
    Before the fix, the journal kept no finish time and the restarted GM reported the time of its recovery."""
    lm = LocalMaster(0, SPEC.partitions[0], ended_runs_kept=100)

    async def lives() -> None:
        first = _Life(tmp_path, 10, lm)
        await first.service.recover()
        await first.submit("j", 2)
        nodes = first.launch(first.batches())
        completions = [
            out.msg
            for out in lm.handle(WorkerReport(0, [FinishedTask("j.0", nodes["j.0"], gm=0)]), time.time())
            if isinstance(out.msg, Completions)
        ]
        core = first.service.core
        assert core is not None and completions
        for msg in completions:
            core.handle(msg, time.time())
        reported = first.service.jobs.status("j")
        assert reported is not None
        finished_at = reported.tasks[0].finished_at
        assert reported.tasks[0].state == "finished" and finished_at is not None
        assert first.service.journal is not None
        first.service.journal.close()  # the crash, before the completion was acknowledged

        second = _Life(tmp_path, 10, lm)
        await second.service.recover()
        core = second.service.core
        assert core is not None
        for msg in completions:  # delivered again by the broker
            core.handle(msg, time.time())
        again = second.service.jobs.status("j")
        assert again is not None
        assert [(t.state, t.finished_at) for t in again.tasks] == [("finished", finished_at), ("launched", None)]
        assert second.service.jobs.unfinished() == 1 and second.service.jobs.ended_here == []
        assert second.service.journal is not None
        second.service.journal.close()
        third = Journal.replay(second.service.journal_path())  # the rewritten journal keeps the time too
        assert third.ends == {"j.0": End("finished", "", finished_at)}

    asyncio.run(lives())


class _Events:
    """Keeps the task events the GM publishes."""

    def __init__(self) -> None:
        self.events: list[TaskEvent] = []

    async def publish(self, exchange: str, routing_key: str, body: bytes, headers: object = None) -> None:
        if exchange == "events":
            self.events.extend(TaskEvents.model_validate_json(body).events)

    publish_confirmed = publish  # as the broker's: here every message is confirmed at once


def test_an_end_a_killed_lm_published_and_its_successor_forwards_is_one_event_at_the_run_s_finish(
    tmp_path: Path,
) -> None:
    """An LM publishes a run's end as a task event, then is killed before its GM hears of it; the worker's report
    reaches the restarted LM, which did not place that run and forwards it. The GM announces the forwarded end at
    the time the worker measured, so a consumer of the event stream sees one end, not two (before the fix the GM
    stamped the time it learnt of it: `megha chaos` counted such a task as finished twice)."""
    lm = LocalMaster(0, SPEC.partitions[0])
    broker = _Events()

    async def life() -> None:
        gm = _Life(tmp_path, 10, lm, broker)
        await gm.service.recover()
        await gm.submit("j")
        node = gm.launch(gm.batches())["j.0"]
        measured = FinishedTask("j.0", node, gm=0, cpu_seconds=1.0, started_at=1000.0, finished_at=1005.0)
        # The killed LM published this (the LM service's event for a run it placed carries the worker's time):
        published = TaskEvent(kind="finished", task_id="j.0", job_id="j", lm=0, node=node, at=1005.0, attempt=1)
        rebuilt = LocalMaster(0, SPEC.partitions[0], incarnation=1)
        rebuilt.adopt([])
        rebuilt.start(time.time())
        (forwarded,) = [
            o.msg for o in rebuilt.handle(WorkerReport(0, [measured]), time.time()) if isinstance(o.msg, Completions)
        ]
        assert [(c.task_id, c.forwarded, c.finished_at) for c in forwarded.items] == [("j.0", True, 1005.0)]
        core = gm.service.core
        assert core is not None
        core.handle(CompletionsModel.model_validate_json(CompletionsModel.core_json(forwarded)).to_core(), 2e9)
        await gm.service.dispatch._publish_ends()
        assert [(e.kind, e.task_id, e.at) for e in broker.events] == [("finished", "j.0", 1005.0)]
        status = gm.service.jobs.status("j")
        assert status is not None and [(t.state, t.finished_at) for t in status.tasks] == [("finished", 1005.0)]

        recorder = EventRecorder()
        job = JobSpec("j", (TaskSpec("j.0", "j", "u", 60.0, (500, 256), 0),), 0.0)
        recorder.expect(0, job)
        recorder.accept(job)
        for event in [published, *broker.events]:
            recorder.record(event, event.at - 1000.0)
        assert recorder.tasks.columns["completions"][0] == 1 and recorder.open == 0
        assert gm.service.journal is not None
        gm.service.journal.close()

    asyncio.run(life())


def test_a_write_the_disk_refuses_leaves_nothing_of_its_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk takes half a record and refuses the rest: the half is cut off again, and nothing of the refused
    record reaches the journal later (a buffered write did, once the disk had room: a refused job ran after a
    restart)."""
    journal = Journal(tmp_path / "run.gm-0.journal")
    journal.append({"end": "a.0", "state": "finished", "reason": ""})
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        if len(data) > 8:
            return real_write(fd, bytes(data[:8]))  # the disk takes 8 bytes, then has no room
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(NotWritten):
        asyncio.run(journal.append_durably({"job": {"job_id": "refused", "tasks": []}, "at": 1.0}))
    with pytest.raises(OSError):
        journal.append({"end": "b.0", "state": "finished", "reason": ""})
    assert journal.failing == "a write failed: [Errno 28] No space left on device"  # /healthz and metrics say so
    monkeypatch.setattr(os, "write", real_write)  # room again
    journal.append({"end": "c.0", "state": "finished", "reason": ""})
    assert journal.failing is None
    journal.close()
    replayed = Journal.replay(journal.path)
    assert replayed.jobs == [] and set(replayed.ends) == {"a.0", "c.0"} and replayed.damaged == 0


def test_records_whose_sync_failed_are_cut_off_so_a_refused_job_never_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jobs of a group whose fsync failed are refused (503), so their lines, and those written since, go."""
    journal = Journal(tmp_path / "run.gm-0.journal")

    async def accepted_then_refused() -> None:
        await journal.append_durably({"job": {"job_id": "kept", "tasks": []}, "at": 1.0})
        monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
        outcomes = await asyncio.gather(
            journal.append_durably({"job": {"job_id": "r1", "tasks": []}, "at": 2.0}),
            journal.append_durably({"job": {"job_id": "r2", "tasks": []}, "at": 3.0}),
            return_exceptions=True,
        )
        assert all(isinstance(o, OSError) for o in outcomes), outcomes

    asyncio.run(accepted_then_refused())
    journal.close()
    assert [job["job_id"] for job, _ in Journal.replay(journal.path).jobs] == ["kept"]


@pytest.mark.asyncio
async def test_while_the_journal_refuses_jobs_the_gm_s_health_check_and_metrics_say_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk: a submission is refused (503), and until a write succeeds again the GM's `/healthz` names the
    failure in `journal_failing` (still ready: it answers and places what it accepted) and the metric
    `megha_gm_journal_failing` is 1."""
    import httpx
    from test_identities import CLUSTER, TASK
    from test_services_http import NOWHERE

    from megha.services.gm.app import create_app

    settings = GMSettings(auth="off", lm_urls=[NOWHERE], http_timeout=1.0, lm_timeout=600.0, journal_dir="")
    app = create_app(settings, use_broker=False, cluster=CLUSTER)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gm") as c,
    ):
        service = app.state.service
        service.journal = Journal(tmp_path / "run.gm-0.journal")
        real_write = os.write
        monkeypatch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space")))
        refused = await c.post("/v1/jobs", json={"tasks": [TASK]})
        failing = (await c.get("/healthz")).json(), (await c.get("/metrics")).text
        monkeypatch.setattr(os, "write", real_write)
        accepted = await c.post("/v1/jobs", json={"tasks": [TASK]})
        fine = (await c.get("/healthz")).json(), (await c.get("/metrics")).text
        service.journal.close()
    assert refused.status_code == 503 and "No space" in refused.text, refused.text
    assert accepted.status_code == 201, accepted.text
    assert failing[0]["ready"] is True and failing[0]["journal_failing"] == "a write failed: [Errno 28] No space"
    assert 'megha_gm_journal_failing{gm="0"} 1.0' in failing[1]
    assert fine[0]["journal_failing"] == "" and 'megha_gm_journal_failing{gm="0"} 0.0' in fine[1]


def test_a_json_line_that_is_no_record_of_the_gm_s_is_skipped_not_fatal(tmp_path: Path) -> None:
    """`{"end": "x"}` (no state) and other well-formed lines of the wrong shape are skipped like a torn line: the
    GM starts (it failed at every start with a KeyError)."""
    path = tmp_path / "run.gm-0.journal"
    lines = ['{"end":"nosuchtask"}', '{"job":{"job_id":"a","tasks":[]}}', '{"retry":"t","attempt":"x"}']
    path.write_text("\n".join([*lines, '{"end":"a.0","state":"finished","reason":""}']) + "\n")
    replayed = Journal.replay(path)
    assert replayed.damaged == 3 and list(replayed.ends) == ["a.0"] and replayed.jobs == []


def test_an_end_the_journal_cannot_take_is_logged_and_the_job_table_still_takes_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A full or read-only disk under a task's end: the end record is logged as not journaled, not raised (raised,
    the completion's handler failed after the core had applied it, and the job stayed unfinished for ever)."""
    from types import SimpleNamespace

    from megha.services.gm.recovery import Restart

    class FullJournal:
        def append(self, record: dict[str, object]) -> str:
            raise OSError(errno.ENOSPC, "No space left on device")

    task = SimpleNamespace(finished_at=5.0)
    gm = SimpleNamespace(journal=FullJournal(), replicator=None, jobs=SimpleNamespace(tasks={"a.0": task}))
    Restart(gm).journal_end("a.0", "finished", "")  # type: ignore[arg-type]
    Restart(gm).journal_retry(TaskSpec("a.1", "a", "u", 1.0, (1, 1), 0), 1)  # type: ignore[arg-type]
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "could not journal {'end'",
        "could not journal {'retry'",
    ]
