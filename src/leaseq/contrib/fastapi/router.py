"""The HTTP face of "accepted, job id": ``POST /jobs/{task}`` and ``GET /jobs/{task}/{job_id}``.

* Only the tasks given to ``jobs_router`` are exposed (none by default); any other name is a
  404, never a lookup in the App's registry.
* ``POST`` checks the JSON body against the task's signature (422 with the reason: argument
  names and types, never values), enqueues, and answers ``202 {"job_id": …}``.
* Every job id starts with the caller's owner tag (a hash of the principal the
  ``principal`` dependency returns, ``owner_tag``), so a job belongs to the caller that
  submitted it with no column to keep it in.
* ``Idempotency-Key``: the rest of the job id is derived from the task, the caller and the
  key, so a replay finds the same job (202, same id) and the same key with another body is a
  409. Two callers using the same key never meet. Without the header every request makes a
  new job.
* ``GET`` returns the job's status, attempts, result and journal to the caller that
  submitted it; 404 for an unknown id, a job of another task (job ids are unique per queue,
  and a task names its queue) or another caller's job (the same answer, so ids cannot be
  probed).
* Auth is the app's: ``principal`` is a FastAPI dependency that returns who is calling (and
  raises 401/403 itself); ``dependencies`` adds any other.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fastapi import APIRouter, Body, Depends, Header, HTTPException, Request

from leaseq.app import App, PayloadMismatch, Task
from leaseq.contrib.fastapi.lifespan import app_of
from leaseq.errors import InvalidInput, JobConflict
from leaseq.job import Job, JournalEntry

#: Longest Idempotency-Key accepted (characters).
MAX_KEY_CHARS = 255
#: Length of the owner tag that starts every job id the router makes (hex characters).
OWNER_TAG_CHARS = 16


def anonymous() -> str:
    """The principal when the router is given none: every caller is the same one."""
    return ""


def jobs_router(jobs: App, tasks: Iterable[Task | str] = (), *,
                principal: Callable[..., Any] = anonymous, prefix: str = "/jobs",
                dependencies: Sequence[Any] = ()) -> APIRouter:
    """An ``APIRouter`` exposing ``tasks`` of ``jobs`` (Task objects or registered names)."""
    exposed = {t.name: t for t in (_task(jobs, t) for t in tasks)}
    router = APIRouter(prefix=prefix, dependencies=list(dependencies), tags=["jobs"])

    @router.post("/{task}", status_code=202)
    async def submit(task: str, request: Request,
                     payload: dict[str, Any] = Body(default_factory=dict),
                     idempotency_key: str | None = Header(default=None),
                     who: Any = Depends(principal)) -> dict[str, str]:
        found = _exposed(exposed, task)
        try:
            found.signature.check(payload)
        except PayloadMismatch as exc:
            raise HTTPException(422, str(exc)) from None
        job_id = _job_id(found, who, idempotency_key)
        try:
            await found.aenqueue_payload(payload, job_id=job_id)
        except JobConflict:
            raise HTTPException(409, "this Idempotency-Key was used with another body") from None
        except InvalidInput as exc:  # too large, not JSON-serialisable, …
            raise HTTPException(422, str(exc)) from None
        return {"job_id": job_id}

    @router.get("/{task}/{job_id}")
    async def status(task: str, job_id: str, request: Request,
                     who: Any = Depends(principal)) -> dict[str, Any]:
        found = _exposed(exposed, task)
        queue = app_of(request).queue(found.queue)
        try:
            job = await queue.aget(job_id)
        except InvalidInput:
            job = None
        if not owns(who, job_id) or job is None or job.task != found.name:
            raise HTTPException(404, "no such job")
        return _describe(job, await queue.ajournal(job_id))

    return router


def _task(jobs: App, task: Task | str) -> Task:
    found = jobs.get_task(task) if isinstance(task, str) else task
    if found is None:
        raise InvalidInput(f"jobs_router: no task named {task!r} in the App")
    return found


def _exposed(exposed: dict[str, Task], name: str) -> Task:
    found = exposed.get(name)
    if found is None:
        raise HTTPException(404, "no such task")
    return found


def owner_tag(who: Any) -> str:
    """What every job id made for principal ``who`` starts with: a hash of its ``str()``,
    which no other principal can produce (it is not a secret; the principal is)."""
    material = ("leaseq-owner\x1f" + str(who)).encode("utf-8", "surrogatepass")
    return hashlib.sha256(material).hexdigest()[:OWNER_TAG_CHARS]


def owns(who: Any, job_id: str) -> bool:
    """Whether ``job_id`` was made for principal ``who`` (``new_job_id`` or a replay id)."""
    return job_id.startswith(owner_tag(who) + "-")


def new_job_id(who: Any) -> str:
    """A new random job id owned by ``who``: for a path operation of the app's own that
    enqueues a job its caller then polls through the router's ``GET``."""
    return f"{owner_tag(who)}-{uuid.uuid4().hex}"


def _job_id(task: Task, who: Any, key: str | None) -> str:
    """A new random id, or one derived from (task, principal, key): stable for replays,
    and the same key from two principals or for two tasks never collides."""
    if key is None:
        return new_job_id(who)
    if not key or len(key) > MAX_KEY_CHARS:
        raise HTTPException(422, f"Idempotency-Key must be 1-{MAX_KEY_CHARS} characters")
    material = "\x1f".join((task.name, str(who), key)).encode("utf-8", "surrogatepass")
    return f"{owner_tag(who)}-idem-{hashlib.sha256(material).hexdigest()[:40]}"


def _describe(job: Job, journal: list[JournalEntry]) -> dict[str, Any]:
    return {
        "job_id": job.id, "task": job.task, "status": job.status,
        "attempts": job.attempts, "max_attempts": job.max_attempts,
        "result": job.result, "error": job.error, "failure": job.failure,
        "journal": [{"at": e.at.isoformat(), "event": e.event, "attempt": e.attempt,
                     "reason": e.reason} for e in journal],
    }
