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
