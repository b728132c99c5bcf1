"""A FastAPI app that accepts report requests as leaseq jobs.

    POST /jobs/build_report          202 {"job_id": ...}   (Idempotency-Key: replay-safe)
    GET  /jobs/build_report/{job_id} status, attempts, result, journal
    POST /reports                    a path operation of the app's own, enqueueing itself

Every route needs ``Authorization: Bearer <token>`` with a token of ``TOKENS`` (a stand-in for
the app's real authentication); the caller it names owns the jobs it submits (only it can
read them) and scopes the Idempotency-Key.
``EMBEDDED_WORKER=1`` runs the worker inside the server process.
"""

from __future__ import annotations

import os

from fastapi import Depends, FastAPI, Header, HTTPException
from jobs import app as jobs
from jobs import build_report

from leaseq import Queue
from leaseq.contrib.fastapi import jobs_router, lifespan, new_job_id, queue_dependency
from leaseq.worker import WorkerConfig

TOKENS = {"secret-token-alice": "alice", "secret-token-bob": "bob"}


def current_user(authorization: str = Header(default="")) -> str:
    """The caller, from a bearer token: the auth dependency the router runs behind."""
    user = TOKENS.get(authorization.removeprefix("Bearer "))
    if user is None:
        raise HTTPException(401, "unknown or missing bearer token")
    return user


embedded = WorkerConfig(grace_s=5, idle_max_s=0.2) if os.environ.get("EMBEDDED_WORKER") else False
api = FastAPI(lifespan=lifespan(jobs, worker=embedded))
api.include_router(jobs_router(jobs, tasks=[build_report], principal=current_user))


@api.post("/reports", status_code=202)
async def request_report(customer_id: int, month: str, user: str = Depends(current_user),
                         reports: Queue = Depends(queue_dependency("reports"))) -> dict[str, str]:
    # the caller's own id, so it can poll GET /jobs/build_report/{job_id}
    result = await build_report.aenqueue(customer_id, month, job_id=new_job_id(user))
    job = await reports.aget(result.job_id)
    return {"job_id": result.job_id, "status": job.status if job else "unknown"}
