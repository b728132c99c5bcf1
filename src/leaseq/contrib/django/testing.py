"""Test helpers: run enqueued jobs synchronously, inside a ``TestCase``'s transaction.

A Django ``TestCase`` wraps each test in a transaction that is never committed, so a worker
process (another connection) would never see the jobs a test enqueues. ``run_jobs`` claims
and runs them on the test's own thread and connection (through the ``django://`` store),
with the worker's own outcome rules (retries, ``Permanent``, invalid payloads)::

    from leaseq.contrib.django.testing import run_jobs

    class SignupTests(TestCase):
        def test_welcome_mail_is_sent(self):
            self.client.post("/signup/", {"email": "a@example.com"})
            jobs = run_jobs()
            self.assertEqual([j.status for j in jobs], ["done"])
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable

from asgiref.sync import async_to_sync

from leaseq.app import App, Task
from leaseq.job import Job
from leaseq.metrics import Metrics
from leaseq.runner import InFlight, Runner

WORKER_ID = "django-test:run_jobs"


def run_jobs(app: App | None = None, queues: Iterable[str] | None = None, *,
             limit: int = 1_000) -> list[Job]:
    """Claim and run every ready job of ``queues`` (default: the app's) one by one, in this
    thread, until none is ready (at most ``limit`` runs). Returns each job as its run left
    it (``done``, ``failed``, or ``pending`` when it was scheduled for a retry). ``app``
    defaults to ``settings.LEASEQ_APP``'s."""
    if app is None:
        from leaseq.contrib.django.settings import project_app

        app = project_app()
    names = list(queues) if queues is not None else app.queue_names()
    runner = Runner(app, Metrics())
    finished: list[Job] = []
    while len(finished) < limit:
        job = _claim_next(app, names)
        if job is None:
            return finished
        finished.append(_run(app, runner, job))
    return finished


def _claim_next(app: App, names: list[str]) -> Job | None:
    for name in names:
        claimed = app.queue(name).claim(WORKER_ID)
        if claimed:
            return claimed[0]
    return None


def _run(app: App, runner: Runner, job: Job) -> Job:
    queue = app.queue(job.queue)
    task = _on_this_thread(app.get_task(job.task))
    lease_s = task.policy.lease_s if task is not None else queue.policy.lease_s
    item = InFlight(job=job, task=task, queue=queue, lease_s=lease_s,
                    heartbeat_every_s=lease_s / 3, next_beat_at=time.monotonic() + lease_s)
    runner.run_sync(item)
    return queue.get(job.id) or job


def _on_this_thread(task: Task | None) -> Task | None:
    """An ``async def`` task as a sync one: ``async_to_sync`` runs it on an event loop of its
    own and sends its ``sync_to_async(thread_sensitive=True)`` calls (the async ORM's) back to
    this thread, so it too sees the test's transaction."""
    if task is None or not task.is_async:
        return task
    shim = copy.copy(task)
    shim.func = async_to_sync(task.func)
    shim.is_async = False
    return shim
