"""``wait`` and ``await_result`` on a SQLite file in rollback-journal mode (a ``django://``
alias without WAL, a file system WAL cannot run on), where another connection's write lock
(``BEGIN EXCLUSIVE``, a writer waiting to commit) blocks every reader. The change counter
read on the event loop must not wait for it (sqlite3's default busy timeout held the loop up
to 5 s, then raised a raw ``sqlite3.OperationalError``): the job is read again off the loop
instead, and what still fails there is ``StoreUnavailable``."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaseq import Queue, StoreUnavailable
from leaseq.job import Job
from leaseq.stores import connect
from leaseq.stores.base import Store

#: How long the other connection holds the lock: well inside the watch's old 5 s wait.
LOCK_S = 2.0
#: The loop's worst stall allowed: a bound on a wait for the lock, not a speed target.
STALL_BOUND_S = 0.5


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "jobs.db")


def _open_without_wal(url: str) -> Store:
    """The store on a file in rollback-journal mode. The store asks for WAL, which some file
    systems refuse; its one connection switches the file back, standing in for those."""
    store = connect(url)
    store._conn.execute("PRAGMA journal_mode = DELETE")  # type: ignore[attr-defined]
    return store


@pytest.fixture
def store(db_path: str) -> Iterator[Store]:
    opened = _open_without_wal(f"sqlite:///{db_path}")
    yield opened
    opened.close()


class Locker:
    """Another connection (as another process would) that takes ``BEGIN EXCLUSIVE`` when
    told, holds it for ``hold_s`` or until released, then optionally finishes the job."""

    def __init__(self, path: str, hold_s: float, finish: str | None = None):
        self.take, self.taken, self.release = (threading.Event(), threading.Event(),
                                               threading.Event())
        self._path, self._hold_s, self._finish = path, hold_s, finish
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        conn = sqlite3.connect(self._path, isolation_level=None)
        try:
            if not self.take.wait(10):
                return
            conn.execute("BEGIN EXCLUSIVE")
            self.taken.set()
            self.release.wait(self._hold_s)
            conn.execute("ROLLBACK")
        finally:
            conn.close()
        if self._finish is not None:
            with connect(f"sqlite:///{self._path}") as other:
                q = Queue(other, "work")
                q.complete(q.claim("finisher")[0], {"answer": 42})


def _note_first_wait(store: Store, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An event set when the waiter first sleeps on its watch (after its first read)."""
    waiting = threading.Event()
    watch_finish = store.watch_finish

    def noting_watch(queue: str, job_id: str):  # type: ignore[no-untyped-def]
        watch = watch_finish(queue, job_id)
        wait, await_ = watch.wait, watch.await_

        def noting_wait(timeout_s: float) -> None:
            waiting.set()
            wait(timeout_s)

        async def noting_await(timeout_s: float) -> None:
            waiting.set()
            await await_(timeout_s)

        watch.wait, watch.await_ = noting_wait, noting_await  # type: ignore[method-assign]
        return watch

    monkeypatch.setattr(store, "watch_finish", noting_watch)
    return waiting


class Ticker:
    """The loop's worst stall: the longest step of a 1 ms ticker, from ``start`` to ``stop``."""

    def __init__(self) -> None:
        self.worst_s = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.001)
            self.worst_s = max(self.worst_s, loop.time() - before)

    def stop(self) -> float:
        assert self._task is not None
        self._task.cancel()
        return self.worst_s


async def _outcome(work: asyncio.Future[Job]) -> Job | BaseException:
    try:
        return await asyncio.wait_for(work, 30)
    except Exception as exc:
        return exc


def _await_through_the_lock(store: Store, q: Queue, waiting: threading.Event,
                            locker: Locker) -> tuple[float, Job | BaseException]:
    """Await job j1's result while ``locker`` takes the lock, once the waiter sleeps on its
    watch: the loop's worst stall meanwhile, and what the await gave (a job or an error)."""
    async def scenario() -> tuple[float, Job | BaseException]:
        ticker = Ticker()
        ticker.start()
        waiter = asyncio.ensure_future(q.await_result("j1", timeout_s=20))
        await asyncio.to_thread(waiting.wait, 10)
        locker.take.set()
        await asyncio.to_thread(locker.taken.wait, 10)
        try:
            outcome = await _outcome(waiter)
        finally:
            locker.release.set()
            await store.aclose()
        return ticker.stop(), outcome

    return asyncio.run(scenario())


def test_await_result_keeps_the_loop_free_while_another_connection_holds_the_lock(
        store: Store, db_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a pending job, and a waiter asleep on its watch
    q = Queue(store, "work")
    q.enqueue("j1", {})
    waiting = _note_first_wait(store, monkeypatch)
    locker = Locker(db_path, hold_s=LOCK_S, finish="done")

    # When another connection holds the lock for 2 s, then finishes the job
    worst, outcome = _await_through_the_lock(store, q, waiting, locker)
    locker.thread.join(10)
    # Then the loop never waited on the lock, and the result came once the job finished
    assert worst < STALL_BOUND_S, f"the event loop stalled {worst:.2f} s on the lock"
    assert isinstance(outcome, Job), f"await_result raised {outcome!r}"
    assert outcome.status == "done" and outcome.result == {"answer": 42}


def _impatient_store(db_path: str, monkeypatch: pytest.MonkeyPatch
                     ) -> tuple[Store, Queue, threading.Event, Locker]:
    """A store that waits 200 ms for a lock, its queue holding pending job j1, the event of
    a waiter's first sleep on j1's watch, and a locker that holds the lock until released."""
    store = _open_without_wal(f"sqlite:///{db_path}?busy_timeout_ms=200")
    q = Queue(store, "work")
    q.enqueue("j1", {})
    return store, q, _note_first_wait(store, monkeypatch), Locker(db_path, hold_s=30)


def test_await_result_past_the_stores_busy_timeout_is_store_unavailable(
        db_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a store that waits 200 ms for a lock, a pending job, and a waiter on its watch
    store, q, waiting, locker = _impatient_store(db_path, monkeypatch)

    try:
        # When another connection holds the lock until the waiter has given up
        worst, outcome = _await_through_the_lock(store, q, waiting, locker)
    finally:
        locker.release.set()
        locker.thread.join(10)
        store.close()
    # Then the waiter gave up on the store's timeout, typed, and the loop never waited
    assert isinstance(outcome, StoreUnavailable), f"await_result raised {outcome!r}"
    assert worst < STALL_BOUND_S, f"the event loop stalled {worst:.2f} s on the lock"


def test_wait_past_the_stores_busy_timeout_is_store_unavailable(
        db_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a store that waits 200 ms for a lock, a pending job, and a waiter on its watch
    store, q, waiting, locker = _impatient_store(db_path, monkeypatch)
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            q.wait("j1", timeout_s=20)
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    try:
        waiter.start()
        assert waiting.wait(10)
        # When another connection holds the lock until the waiter has given up
        locker.take.set()
        assert locker.taken.wait(10)
        started = time.monotonic()
        waiter.join(30)
    finally:
        locker.release.set()
        locker.thread.join(10)
        store.close()
    # Then the wait ended on the store's timeout, typed (not sqlite3's error after 5 s)
    assert outcome and isinstance(outcome[0], StoreUnavailable), f"wait raised {outcome!r}"
    assert time.monotonic() - started < 4.5
