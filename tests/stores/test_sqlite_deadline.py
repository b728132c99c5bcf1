"""SQLite-specific: a call made within a deadline (``leaseq.deadline.within``: a heartbeat, a
shutdown's give-back) waits for the locks no longer than the deadline, whoever holds them; and a
COMMIT SQLite refuses leaves the store usable."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaseq.deadline import within
from leaseq.errors import StoreUnavailable
from leaseq.job import Job
from leaseq.queue import Queue
from leaseq.stores.sqlite.store import SQLiteStore

#: The store's busy timeout in these tests: long enough that a wait that ignores the deadline
#: shows, short enough that such a failure ends the test quickly.
BUSY_MS = 20_000


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "jobs.db")


@pytest.fixture
def store(path: str) -> Iterator[SQLiteStore]:
    store = SQLiteStore(path, busy_timeout_ms=BUSY_MS)
    yield store
    store.close()


def _claimed(store: SQLiteStore) -> tuple[Queue, Job]:
    q = store.queue("work")
    q.enqueue("j", {})
    [job] = q.claim("w1", 1, lease_s=60)
    return q, job


def test_a_beat_waits_for_another_processs_write_lock_no_longer_than_its_deadline(
        store: SQLiteStore, path: str) -> None:
    # Given a claimed job, and another process holding the database's write lock
    q, job = _claimed(store)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        # When its lease is extended within 0.3 s
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="busy"), within(0.3):
            q.heartbeat([job], lease_s=60)
        # Then the call gave up at its deadline, not after the busy timeout (20 s)
        assert time.monotonic() - started < BUSY_MS / 1000 / 2
    finally:
        other.execute("ROLLBACK")
        other.close()
    # And a call without a deadline waits as long as before, and goes through
    assert store._conn.execute("PRAGMA busy_timeout").fetchone() == (BUSY_MS,)
    assert q.heartbeat([job], lease_s=60) == []


def test_a_beat_waits_for_another_threads_transaction_no_longer_than_its_deadline(
        store: SQLiteStore) -> None:
    # Given a claimed job, and another thread of this process inside a write transaction
    q, job = _claimed(store)
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with store._tx():
            inside.set()
            leave.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert inside.wait(10)
        # When its lease is extended within 0.3 s
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="deadline"), within(0.3):
            q.heartbeat([job], lease_s=60)
        # Then the call gave up at its deadline instead of waiting for the other to end
        assert time.monotonic() - started < 10
    finally:
        leave.set()
        holder.join(30)
    assert q.heartbeat([job], lease_s=60) == []


def test_a_commit_sqlite_refuses_is_rolled_back_and_the_store_goes_on(
        store: SQLiteStore) -> None:
    # Given a write whose COMMIT SQLite refuses (a deferred foreign key stands in for a full
    # disk: SQLite keeps the transaction open after either)
    conn = store._conn
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("CREATE TEMP TABLE parent (id INTEGER PRIMARY KEY)")
    conn.execute("CREATE TEMP TABLE child (p INTEGER REFERENCES parent (id) "
                 "DEFERRABLE INITIALLY DEFERRED)")
    with pytest.raises(StoreUnavailable, match="could not commit"), store._tx() as tx:
        tx.execute("INSERT INTO temp.child VALUES (1)")
    # Then nothing of it was written, and the next write opens its own transaction
    assert not conn.in_transaction
    assert conn.execute("SELECT count(*) FROM temp.child").fetchone() == (0,)
    q = store.queue("work")
    q.enqueue("j", {})
    assert q.get("j") is not None
