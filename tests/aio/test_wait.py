"""``Queue.wait`` and ``await Queue.await_result``: the finished job, or ``TimeoutError``.
Woken by the store's change signal (PostgreSQL: the finish's NOTIFY; SQLite: the change
counter), so a finish is seen long before the watch's fallback poll would see it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from leaseq import JobNotFound, Queue
from leaseq.stores import connect
from leaseq.stores.base import Store
from leaseq.stores.watch import NOTIFY_FALLBACK_S

FINISH_AFTER_S = 0.3


def _finish_later(store_url: str, job_id: str, status: str = "done") -> threading.Thread:
    """Another connection (as another process would) claims and finishes the job."""
    def run() -> None:
        with connect(store_url) as other:
            q = Queue(other, "work")
            time.sleep(FINISH_AFTER_S)
            job = q.claim("finisher")[0]
            if status == "done":
                q.complete(job, {"answer": 42})
            else:
                q.fail(job, "bad input")
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_wait_returns_the_finished_job_when_it_finishes(store: Store, store_url: str) -> None:
    q = Queue(store, "work")
    q.enqueue("j1", {})
    finisher = _finish_later(store_url, "j1")
    started = time.monotonic()
    job = q.wait("j1", timeout_s=10)
    took = time.monotonic() - started
    finisher.join()
    assert job.status == "done" and job.result == {"answer": 42}
    # woken by the signal, not by the fallback poll (which would take a second)
    assert took < FINISH_AFTER_S + NOTIFY_FALLBACK_S * 0.6, took


def test_await_result_returns_a_failed_job(store: Store, store_url: str) -> None:
    q = Queue(store, "work")
    q.enqueue("j1", {})
    finisher = _finish_later(store_url, "j1", status="failed")

    async def scenario() -> tuple[object, float]:
        started = time.monotonic()
        job = await q.await_result("j1", timeout_s=10)
        took = time.monotonic() - started
        await store.aclose()
        return job, took

    job, took = asyncio.run(scenario())
    finisher.join()
    assert job.status == "failed" and job.failure == "permanent"  # type: ignore[attr-defined]
    assert took < FINISH_AFTER_S + NOTIFY_FALLBACK_S * 0.6, took


def test_wait_times_out_and_a_finished_job_returns_at_once(store: Store) -> None:
    q = Queue(store, "work")
    q.enqueue("j1", {})
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"did not finish within 0\.2 s"):
        q.wait("j1", timeout_s=0.2)
    assert 0.2 <= time.monotonic() - started < 1.5
    q.cancel("j1")
    assert q.wait("j1", timeout_s=0).status == "cancelled"
    with pytest.raises(JobNotFound):
        q.wait("missing", timeout_s=1)

    async def timeout() -> None:
        await q.await_result("nope-yet", timeout_s=0.1)

    with pytest.raises(JobNotFound):
        asyncio.run(timeout())
