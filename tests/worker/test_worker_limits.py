"""Limits in the claim through the high-level API and the real worker (docs/limits.md): a
task's default priority and per-call priority and key; a worker on a key-limited queue runs
no more of a key at once than the limit, whatever its slots and prefetch."""

from __future__ import annotations

import threading
import time

import pytest
from worker_helpers import running, wait_until

import leaseq
from leaseq.errors import InvalidInput


def test_a_tasks_priority_is_its_jobs_default_and_a_call_may_override_it(
        app: leaseq.App) -> None:
    # Given a task with priority 5
    @app.task(queue="work", priority=5)
    def export(n: int) -> None: ...

    # When jobs are enqueued with the default, another priority, and a key
    export.enqueue(n=1, job_id="default")
    export.enqueue(n=2, job_id="urgent", priority=20, concurrency_key="tenant:7")
    queue, spec = export.spec(n=3, job_id="later", priority=-1)
    app.enqueue_many([(queue, spec)])
    # Then each carries its own, and claims go highest first
    q = app.queue("work")
    got = {j.id: (j.priority, j.concurrency_key) for j in q.iter_jobs()}
    assert got == {"default": (5, None), "urgent": (20, "tenant:7"), "later": (-1, None)}
    assert [q.claim("w")[0].id for _ in range(3)] == ["urgent", "default", "later"]


def test_a_bad_priority_or_a_task_parameter_named_like_an_option_is_refused(
        app: leaseq.App) -> None:
    with pytest.raises(InvalidInput, match="priority"):
        app.task(queue="work", priority="high")(lambda: None)
    with pytest.raises(InvalidInput):
        @app.task(queue="work")
        def clash(priority: int) -> None: ...


def test_the_worker_runs_no_more_of_a_key_at_once_than_its_limit(url: str) -> None:
    # Given a queue with key_limit 2 and 12 jobs of one key (and 4 without a key), a worker of
    # 8 slots (and its default prefetch)
    app = leaseq.App(url, queues={"limited": {"key_limit": 2}})
    lock, running_now, peaks = threading.Lock(), {"k": 0, None: 0}, {"k": 0, None: 0}

    @app.task(queue="limited")
    def hold(key: str | None) -> None:
        with lock:
            running_now[key] += 1
            peaks[key] = max(peaks[key], running_now[key])
        time.sleep(0.02)
        with lock:
            running_now[key] -= 1

    for i in range(12):
        hold.enqueue(key="k", job_id=f"k{i}", concurrency_key="k")
    for i in range(4):
        hold.enqueue(key=None, job_id=f"u{i}")
    q = app.queue("limited")
    # When the worker drains the queue
    with running(app, concurrency=8):
        wait_until(lambda: q.counts() == {"done": 16}, what="all 16 done")
    app.store.close()
    # Then at most 2 of the key ever ran at once; the jobs without a key were not held back
    assert peaks["k"] == 2, peaks
    assert peaks[None] >= 1
