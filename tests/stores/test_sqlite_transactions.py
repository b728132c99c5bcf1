"""SQLite-specific: enqueue inside the caller's own connection (``connection=``), as on
PostgreSQL (tests/postgres/test_pg_transactions.py): a conflict undoes only the enqueue, and an
enqueue opens no transaction the caller does not decide."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaseq.errors import InvalidInput, JobConflict, StoreUnavailable
from leaseq.stores.sqlite.store import SQLiteStore


@pytest.fixture
def path(tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path / "jobs.db")


@pytest.fixture
def store(path: str) -> Iterator[SQLiteStore]:
    store = SQLiteStore(path)
    store.queue("mail").counts()  # the schema exists
    yield store
    store.close()


def test_a_conflict_undoes_only_the_enqueue_not_the_callers_transaction(
        store: SQLiteStore, path: str) -> None:
    # Given a stored job, and a caller's transaction with its own write
    q = store.queue("mail")
    q.enqueue("j1", {"v": 1})
    conn = sqlite3.connect(path)
    try:
        conn.execute("CREATE TABLE mine (x INTEGER)")
        conn.execute("INSERT INTO mine VALUES (1)")
        # When an enqueue in it conflicts, after a first job of the same call was written
        with pytest.raises(JobConflict):
            q.enqueue_many([q.spec("j2", {}), q.spec("j1", {"v": 2})], connection=conn)
        # Then the caller's own write survives and a commit writes nothing of the enqueue
        assert conn.execute("SELECT count(*) FROM mine").fetchone() == (1,)
        conn.commit()
    finally:
        conn.close()
    assert q.get("j2") is None and q.journal("j2") == []
    assert q.get("j1").payload == {"v": 1}


def test_an_enqueue_first_in_the_callers_connection_waits_for_its_commit(
        store: SQLiteStore, path: str) -> None:
    # Given a connection in the sqlite3 module's default mode, with nothing written yet
    q = store.queue("mail")
    conn = sqlite3.connect(path)
    try:
        # When an enqueue is its first write, and the caller rolls back
        q.enqueue("j1", {}, connection=conn)
        conn.rollback()
        # Then nothing was written; and a commit writes it
        assert q.get("j1") is None
        q.enqueue("j1", {}, connection=conn)
        assert q.get("j1") is None
        conn.commit()
    finally:
        conn.close()
    assert q.get("j1").status == "pending"


def test_autocommit_connection_without_transaction_is_refused(
        store: SQLiteStore, path: str) -> None:
    # Given a connection in autocommit mode with no transaction open (an enqueue of two jobs
    # through it committed the first before the second's conflict)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        # When it is used for an enqueue, then it is refused before any write
        with pytest.raises(InvalidInput, match="autocommit"):
            store.queue("mail").enqueue("j1", {}, connection=conn)
        # But inside an explicit transaction it works
        conn.execute("BEGIN IMMEDIATE")
        store.queue("mail").enqueue("j1", {}, connection=conn)
        conn.execute("COMMIT")
    finally:
        conn.close()
    assert store.queue("mail").get("j1") is not None


class Autocommit(sqlite3.Connection):
    """A connection as Python 3.12's ``sqlite3.connect(..., autocommit=True)`` makes one: no
    implicit transactions, and ``isolation_level`` left at its default ``""``."""

    autocommit = True


def test_a_python_312_autocommit_connection_without_transaction_is_refused(
        store: SQLiteStore, path: str) -> None:
    # Given a connection in Python 3.12's autocommit mode, with no transaction open (leaseq
    # opened one itself, which the caller's commit() then left open and its close rolled back)
    conn = sqlite3.connect(path, factory=Autocommit)
    try:
        assert conn.isolation_level == "" and not conn.in_transaction
        # When it is used for an enqueue, then it is refused before any write
        with pytest.raises(InvalidInput, match="autocommit"):
            store.queue("mail").enqueue("j1", {}, connection=conn)
        assert not conn.in_transaction
    finally:
        conn.close()
    assert store.queue("mail").get("j1") is None


def test_a_full_disk_is_store_unavailable_and_writes_nothing(store: SQLiteStore) -> None:
    # Given a claimed job, and a database file that can take no more pages (a full disk)
    q = store.queue("mail")
    q.enqueue("j1", {})
    (job,) = q.claim("w", 1)
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages}")
    # When its result needs new pages, or a new job does
    with pytest.raises(StoreUnavailable, match="full"):
        q.complete(job, {"blob": "x" * 200_000})
    with pytest.raises(StoreUnavailable, match="full"):
        q.enqueue_many([q.spec(f"n{i}", {"blob": "y" * 10_000}) for i in range(30)])
    # Then it is leaseq's error, which the worker logs and retries (a raw sqlite3 error
    # crashed its claim loop, and left a finishing write unretried), and nothing was written
    assert q.get("j1").status == "processing" and q.get("n0") is None
    store._conn.execute(f"PRAGMA max_page_count = {2**30}")
    assert q.complete(job, {"blob": "x" * 200_000}).status == "done"


def test_a_database_that_refuses_writes_is_store_unavailable_for_the_worker(
        store: SQLiteStore) -> None:
    # Given a job, and a database that refuses every write (as a read-only file or mount
    # does; root ignores a file's mode, so the connection is made read-only instead)
    q = store.queue("mail")
    q.enqueue("j1", {})
    store._conn.execute("PRAGMA query_only = ON")
    # When a worker claims from it, Then the claim fails with leaseq's error, which the
    # worker logs and tries again (the raw sqlite3 error ended Worker.run)
    # (and says why, not that the database is busy)
    with pytest.raises(StoreUnavailable, match="readonly") as refused:
        q.claim("w", 1)
    assert "busy" not in str(refused.value)
    # And reads still work
    assert q.get("j1").status == "pending"


def test_an_enqueue_that_opens_the_callers_transaction_takes_the_write_lock_first(
        store: SQLiteStore, path: str) -> None:
    # Given a stored job, and a caller's connection in the sqlite3 module's default mode
    q = store.queue("mail")
    q.enqueue("j1", {"v": 1})
    conn = sqlite3.connect(path)
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        # When an enqueue that writes nothing (the same job again) opens its transaction
        assert q.enqueue("j1", {"v": 1}, connection=conn).outcome == "unchanged"
        # Then that transaction holds the write lock already: a deferred one read first, and
        # a write committed by another process in between refused its own write at once
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
        conn.rollback()
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        other.close()
        conn.close()


def test_a_callers_transaction_that_read_before_another_wrote_is_store_unavailable(
        store: SQLiteStore, path: str) -> None:
    # Given a caller's transaction that read (a deferred BEGIN), and another write after it
    q = store.queue("mail")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM leaseq_jobs").fetchall()
        q.enqueue("other", {})
        # When an enqueue joins it, Then SQLite's refusal is StoreUnavailable, with the way out
        with pytest.raises(StoreUnavailable, match="BEGIN IMMEDIATE"):
            q.enqueue("j1", {}, connection=conn)
        # And the caller's transaction goes on, without the enqueue
        assert conn.in_transaction
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    assert q.get("j1") is None and q.get("other") is not None


def test_an_async_enqueue_joins_the_callers_connection_and_its_transaction(
        store: SQLiteStore, path: str) -> None:
    # Given a caller's connection with a transaction of its own open
    q = store.queue("mail")
    conn = sqlite3.connect(path, isolation_level=None)

    async def enqueue(job_id: str) -> None:
        await q.aenqueue(job_id, {}, connection=conn)

    try:
        conn.execute("BEGIN IMMEDIATE")
        # When an asyncio caller enqueues in it, then rolls back; and again, then commits
        asyncio.run(enqueue("rolled"))
        conn.execute("ROLLBACK")
        conn.execute("BEGIN IMMEDIATE")
        asyncio.run(enqueue("kept"))
        # Then the enqueue is the caller's: unseen by the store until the commit (it had
        # failed with the driver's "objects created in a thread" error, its connection used
        # on another thread)
        assert q.get("kept") is None
        conn.execute("COMMIT")
    finally:
        conn.close()
    assert q.get("rolled") is None and q.get("kept") is not None


def test_a_purge_lets_go_of_the_write_lock_between_batches(
        store: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given 5 old done jobs, and purges of 2 jobs a transaction (PURGE_BATCH, made small)
    import leaseq.stores.sqlite.store as sqlite_store

    q = store.queue("mail")
    q.enqueue_many([q.spec(f"j{i}", {}) for i in range(5)])
    q.complete_many(q.claim("w", limit=5))
    store.time_offset_s += 100
    monkeypatch.setattr(sqlite_store, "PURGE_BATCH", 2)
    transactions: list[int] = []
    tx = store._tx

    def counted() -> object:
        transactions.append(1)
        return tx()

    monkeypatch.setattr(store, "_tx", counted)
    # When they are purged
    assert q.purge(done=50) == 5
    # Then in three transactions (2, 2, 1), each letting other writers in after it: one
    # transaction held the database's write lock for the whole purge (on a first retention
    # over millions of jobs, for longer than a writer's busy timeout)
    assert len(transactions) == 3
    assert q.counts() == {}
