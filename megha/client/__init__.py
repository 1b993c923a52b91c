"""`megha.client`: typed Python clients of Megha's GMs, `Client` (blocking) and `AsyncClient` (asyncio), over httpx.

    from megha.client import Client

    with Client("http://127.0.0.1:8000", token="...") as gm:
        job = gm.submit({"user": "alice", "tasks": [{"duration": 1.0, "cpu_millicores": 500, "memory_mb": 256}]})
        for event in gm.events(job.job_id):  # JobStatus, then TaskTransition..., then JobEnd
            print(event)
        print(gm.wait(job.job_id, timeout=60).state)

Answers are the pydantic models of megha.common.models (the job's are re-exported here); a refusal or an
unreachable GM raises `MeghaError`. One retry policy (`RetryPolicy`, megha/client/retry.py) decides what is sent
again.
"""

from megha.client.answers import GMState, Health, JobFileError, LMCluster, LMState, read_job_file, submission
from megha.client.clients import AsyncClient, Client
from megha.client.plans import DEFAULT_GM_URL, JobEvent, token_from_env
from megha.client.retry import DEFAULT_RETRY, NO_RETRY, MeghaError, RetryPolicy
from megha.common.models import JobAccepted, JobEnd, JobList, JobStatus, JobSubmission, TaskTransition

__all__ = [
    "DEFAULT_GM_URL",
    "DEFAULT_RETRY",
    "NO_RETRY",
    "AsyncClient",
    "Client",
    "GMState",
    "Health",
    "JobAccepted",
    "JobEnd",
    "JobEvent",
    "JobFileError",
    "JobList",
    "JobStatus",
    "JobSubmission",
    "LMCluster",
    "LMState",
    "MeghaError",
    "RetryPolicy",
    "TaskTransition",
    "read_job_file",
    "submission",
    "token_from_env",
]
