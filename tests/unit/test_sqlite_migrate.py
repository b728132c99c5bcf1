"""SQLite-only: upgrading a database written by an earlier schema version. (The conformance
suite covers fresh databases; these cases need SQL written as the older version wrote it.)"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import leaseq
from leaseq.stores.sql import migrations
from leaseq.stores.sqlite import schema

SQLITE = "leaseq.stores.sqlite"


def given_version_1(path: Path) -> None:
    """A database at schema version 1 holding a stale processing job whose attempts are past
    its new max, and a pending job with its attempts spent."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE leaseq_schema "
                 "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL)")
    version, name, sql = migrations(SQLITE)[0]
    conn.executescript(sql)
    conn.execute("INSERT INTO leaseq_schema VALUES (?, ?, 0)", (version, name))
    conn.execute(
        "INSERT INTO leaseq_jobs (queue, id, status, payload, attempts, max_attempts, "
        "lease_until, lease_epoch, stale, created_at, updated_at, first_seen_at) VALUES "
        "('q', 'stale', 'processing', '{}', 3, 2, 1e10, 3, 1, 0, 0, 0), "
        "('q', 'stuck', 'pending', '{}', 3, 2, 0, 3, 0, 0, 0, 0)")
    conn.close()


def test_upgrade_adds_the_counters_and_resets_stale_jobs(tmp_path: Path) -> None:
    given_version_1(tmp_path / "jobs.db")
    store = leaseq.connect(f"sqlite:///{tmp_path / 'jobs.db'}")
    try:
        assert store.migrate() == migrations(SQLITE)[-1][0]
        stale, stuck = store.get("q", "stale"), store.get("q", "stuck")
        assert stale is not None and (stale.attempts, stale.snoozes, stale.givebacks) == (0, 0, 0)
        assert stuck is not None and stuck.attempts == 3
        # The sweeper then quarantines the job nothing could claim
        assert store.reclaim_expired("q") == (1, 0)
        assert store.get("q", "stuck").failure == "exhausted"  # type: ignore[union-attr]
    finally:
        store.close()


def test_a_migration_another_process_applied_first_is_skipped(tmp_path: Path) -> None:
    # Given a database another process migrated after this one read the versions
    leaseq.connect(f"sqlite:///{tmp_path / 'jobs.db'}").close()
    conn = sqlite3.connect(tmp_path / "jobs.db", isolation_level=None)
    version, name, sql = migrations(SQLITE)[1]
    # When this one applies the same migration (ADD COLUMN cannot run twice), Then it skips it
    schema.apply(conn, version, name, sql)
    assert not conn.in_transaction
    # But a migration that fails and is not recorded still raises
    with pytest.raises(sqlite3.OperationalError):
        schema.apply(conn, 99, "broken", "ALTER TABLE leaseq_jobs ADD COLUMN snoozes;")
    conn.close()


def given_version(path: Path, version: int) -> sqlite3.Connection:
    """A database with the migrations up to ``version`` applied, as that version left it."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE leaseq_schema "
                 "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL)")
    for number, name, sql in migrations(SQLITE):
        if number <= version:
            schema.apply(conn, number, name, sql)
    return conn


def _jobs_and_indexes(conn: sqlite3.Connection) -> tuple[list[tuple[object, ...]], set[str]]:
    rows = conn.execute("SELECT * FROM leaseq_jobs ORDER BY queue, id").fetchall()
    indexes = {sql for (sql,) in conn.execute(
        "SELECT sql FROM sqlite_master WHERE tbl_name = 'leaseq_jobs' AND type = 'index' "
        "AND sql IS NOT NULL")}
    return rows, indexes


def test_the_jobs_table_is_rebuilt_in_write_order_with_every_row_and_index(
        tmp_path: Path) -> None:
    # Given a version-8 database (jobs kept in id order) whose ids sort against their
    # creation order, with every column set on some job, and its journal
    conn = given_version(tmp_path / "jobs.db", 8)
    conn.execute(
        "INSERT INTO leaseq_jobs (queue, id, task, status, payload, attempts, max_attempts, "
        "lease_until, lease_epoch, worker_id, error, failure, revision, stale, result, "
        "result_key, created_at, updated_at, first_seen_at, published_at, snoozes, givebacks, "
        "priority, concurrency_key) VALUES "
        "('q', 'c', 't', 'done', '{\"a\": 1}', 2, 5, NULL, 2, 'w1', 'boom', NULL, 'r1', 0, "
        " '{\"ok\": true}', 'rk', 1.0, 5.0, 1.0, 2.0, 1, 1, 3, 'tenant:1'), "
        "('q', 'b', NULL, 'pending', '{}', 0, 3, 7.0, 0, NULL, NULL, NULL, NULL, 0, NULL, "
        " NULL, 2.0, 2.0, 2.0, NULL, 0, 0, 0, NULL), "
        "('r', 'a', 't', 'failed', '{}', 3, 3, NULL, 3, 'w2', 'e', 'exhausted', NULL, 1, "
        " NULL, NULL, 3.0, 9.0, 3.0, 4.0, 0, 2, -1, 'k')")
    before = _jobs_and_indexes(conn)
    assert "WITHOUT ROWID" in conn.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'leaseq_jobs'").fetchone()[0]
    # When it is migrated (and once more, as a process that raced another would)
    version, name, sql = next(m for m in migrations(SQLITE) if m[0] == 9)
    schema.apply(conn, version, name, sql)
    schema.apply(conn, version, name, sql)
    # Then every job and every index is as it was, the key still unique
    assert _jobs_and_indexes(conn) == before
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("INSERT INTO leaseq_jobs (queue, id, status, payload, max_attempts, "
                     "created_at, updated_at, first_seen_at) "
                     "VALUES ('q', 'b', 'pending', '{}', 1, 0, 0, 0)")
    # And the rows lie in the order they were created, not in id order
    assert [r[0] for r in conn.execute("SELECT id FROM leaseq_jobs ORDER BY rowid")] == [
        "c", "b", "a"]
    conn.close()
    # And the store reads them
    store = leaseq.connect(f"sqlite:///{tmp_path / 'jobs.db'}")
    try:
        job = store.get("q", "c")
        assert job is not None and (job.priority, job.concurrency_key, job.result_key) == (
            3, "tenant:1", "rk")
    finally:
        store.close()


def test_a_migration_applied_again_by_a_process_that_read_stale_versions_changes_nothing(
        tmp_path: Path) -> None:
    # Given a database migrated to the latest version, whose running job has a new revision
    # waiting under another key (next_concurrency_key, migration 010)
    path = tmp_path / "jobs.db"
    with leaseq.connect(f"sqlite:///{path}") as store:
        queue = store.queue("q")
        queue.enqueue("j", {"v": 1}, revision="r1", concurrency_key="k1")
        queue.claim("w:1:aaaaaaaa")
        queue.enqueue("j", {"v": 2}, revision="r2", concurrency_key="k2")
    conn = sqlite3.connect(path, isolation_level=None)
    keys = "SELECT stale, concurrency_key, next_concurrency_key FROM leaseq_jobs"
    before = conn.execute(keys).fetchall()
    # When a process that read the versions before another applied them applies 009 (a
    # rebuild of the jobs table from 009's columns) and then 010 once more
    for number, name, sql in migrations(SQLITE):
        if number in (9, 10):
            schema.apply(conn, number, name, sql)
    # Then nothing ran again: the column and the waiting key are still there
    assert before == [(1, "k1", "k2")]
    assert conn.execute(keys).fetchall() == before
    assert not conn.in_transaction
    conn.close()


def test_a_migration_that_cannot_get_the_write_lock_is_store_unavailable(
        tmp_path: Path) -> None:
    # Given a database one migration behind, and another writer holding its write lock
    path = tmp_path / "jobs.db"
    conn = given_version(path, migrations(SQLITE)[-1][0] - 1)
    conn.execute("PRAGMA journal_mode = WAL")  # as leaseq left it: opening needs no lock
    conn.close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        # When a store opens it and cannot migrate in its busy timeout
        with pytest.raises(leaseq.StoreUnavailable) as refused:
            leaseq.connect(f"sqlite:///{path}?busy_timeout_ms=50")
        # Then the error is leaseq's, naming the file and the cause, and nothing was applied
        assert "cannot migrate" in str(refused.value) and "locked" in str(refused.value)
    finally:
        holder.rollback()
        holder.close()
    conn = sqlite3.connect(path)
    assert schema.version(conn) == migrations(SQLITE)[-1][0] - 1
    conn.close()
