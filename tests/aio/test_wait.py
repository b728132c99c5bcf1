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
from leaseq.stores.watch import NotifyWatch

FINISH_AFTER_S = 0.3
#: Longer than any wait below: a wait that returns the finished job was woken by the store's
#: change signal, not by the watch's fallback poll.
NO_FALLBACK_S = 60.0


@pytest.fixture
def signal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL's watch falls back to reading the job every second (a NOTIFY lost while
    LISTEN was down); made longer than the test's wait, only the NOTIFY can wake it in time.
    (SQLite's change counter is the signal itself.)"""
    monkeypatch.setattr(NotifyWatch, "poll_s", NO_FALLBACK_S)


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


def test_wait_returns_the_finished_job_when_it_finishes(store: Store, store_url: str,
                                                        signal_only: None) -> None:
    q = Queue(store, "work")
    q.enqueue("j1", {})
    finisher = _finish_later(store_url, "j1")
    job = q.wait("j1", timeout_s=10)  # woken by the signal: no fallback poll within 10 s
    finisher.join()
    assert job.status == "done" and job.result == {"answer": 42}


def test_await_result_returns_a_failed_job(store: Store, store_url: str,
                                           signal_only: None) -> None:
    q = Queue(store, "work")
    q.enqueue("j1", {})
    finisher = _finish_later(store_url, "j1", status="failed")

    async def scenario() -> object:
        job = await q.await_result("j1", timeout_s=10)  # woken by the signal, as above
        await store.aclose()
        return job

    job = asyncio.run(scenario())
    finisher.join()
    assert job.status == "failed" and job.failure == "permanent"  # type: ignore[attr-defined]


def test_wait_times_out_and_a_finished_job_returns_at_once(store: Store) -> None:
    q = Queue(store, "work")
    q.enqueue("j1", {})
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"did not finish within 0\.2 s"):
        q.wait("j1", timeout_s=0.2)
    assert 0.2 <= time.monotonic() - started < 5  # its timeout, not the test's
    q.cancel("j1")
    assert q.wait("j1", timeout_s=0).status == "cancelled"
    with pytest.raises(JobNotFound):
        q.wait("missing", timeout_s=1)

    async def timeout() -> None:
        await q.await_result("nope-yet", timeout_s=0.1)

    with pytest.raises(JobNotFound):
        asyncio.run(timeout())


def test_an_await_result_cancelled_while_its_watch_is_made_closes_the_watch(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a store whose watch is slow to make (the thread making it is not cancellable)
    q = Queue(store, "work")
    q.enqueue("j1", {})
    entered, release = threading.Event(), threading.Event()
    made: list[object] = []
    closed: list[object] = []
    watch_finish = store.watch_finish

    def slow_watch(queue: str, job_id: str):  # type: ignore[no-untyped-def]
        entered.set()
        release.wait(10)
        watch = watch_finish(queue, job_id)
        close = watch.close

        def close_and_note() -> None:
            closed.append(watch)
            close()

        watch.close = close_and_note  # type: ignore[method-assign]
        made.append(watch)
        return watch

    monkeypatch.setattr(store, "watch_finish", slow_watch)

    async def cancelled_while_the_watch_is_made() -> None:
        waiter = asyncio.ensure_future(q.await_result("j1", timeout_s=30))
        await asyncio.to_thread(entered.wait, 10)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        # When the thread then makes the watch
        release.set()
        deadline = time.monotonic() + 10
        while not closed and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # the close runs on the loop once the thread has ended

    asyncio.run(cancelled_while_the_watch_is_made())
    # Then the watch nobody waits on any more was closed, not left registered
    assert made and closed == made
