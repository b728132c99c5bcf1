"""SQLite-specific: the outbox's walk and the queue list do work in proportion to what they
return, not to the table. (Store-specific because it reads SQLite's own plans and counts its
virtual machine's steps; the PostgreSQL twin is tests/postgres/test_pg_growth.py.)

A broker backlog is the realistic shape: most pending jobs are published and wait for a
consumer, a few are owed a publish, and a history of finished jobs lies behind them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaseq.stores.sqlite import SQLiteStore
from leaseq.stores.sqlite.store import Q

ROWS = 20_000
#: Virtual-machine steps per progress callback.
STEP = 10

# Four queues; a third finished, the rest pending and published except one in 500 (owed).
LOAD = """
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :rows)
INSERT INTO leaseq_jobs (queue, id, status, payload, attempts, max_attempts, lease_until,
                         lease_epoch, created_at, updated_at, first_seen_at, published_at)
SELECT 'q' || (i % 4), printf('job-%07d', i), CASE WHEN i % 3 = 0 THEN 'done' ELSE 'pending' END,
       '{}', 0, 5, 1000.0 - (i % 600), 0, 0, 0, 0, CASE WHEN i % 500 <> 1 THEN 1.0 END
FROM n
"""


@pytest.fixture
def backlog(tmp_path: Path) -> Iterator[tuple[SQLiteStore, sqlite3.Connection]]:
    store = SQLiteStore(str(tmp_path / "jobs.db"))
    conn = sqlite3.connect(store.path)
    conn.execute(LOAD, {"rows": ROWS})
    conn.commit()
    yield store, conn
    conn.close()
    store.close()


def _plan(conn: sqlite3.Connection, name: str, **params: object) -> list[str]:
    return [row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + Q[name],
                                            {"off": 0.0, **params})]


def _steps(conn: sqlite3.Connection, name: str, **params: object) -> int:
    """How many virtual-machine steps (in units of ``STEP``) the statement took."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    conn.set_progress_handler(count, STEP)
    try:
        conn.execute(Q[name], {"off": 0.0, **params}).fetchall()
    finally:
        conn.set_progress_handler(None, 0)
    return steps


def test_outbox_due_walks_only_the_jobs_owed_a_publish(
        backlog: tuple[SQLiteStore, sqlite3.Connection]) -> None:
    # Given 20,000 jobs, 13,000 of them published and waiting for a consumer
    store, conn = backlog
    # When the dispatcher asks for the next jobs owed a publish
    plan = _plan(conn, "outbox_due", queue="q1", limit=10)
    steps = _steps(conn, "outbox_due", queue="q1", limit=10)
    # Then it searches the outbox index and takes a few hundred steps, not one per backlog job
    assert any("USING INDEX leaseq_jobs_outbox" in line for line in plan), plan
    assert steps * STEP < 2_000, (steps * STEP, plan)
    # And the jobs it gives are the owed ones, in not-before order
    due = store.outbox_due("q1", 10)
    assert len(due) == 10 and all(job.published_at is None for job in due)
    assert [job.lease_until for job in due] == sorted(job.lease_until for job in due)


def test_queues_seeks_once_per_queue(backlog: tuple[SQLiteStore, sqlite3.Connection]) -> None:
    # Given 20,000 jobs over four queues
    store, conn = backlog
    # When the sweeper or the metrics list the queues
    plan = _plan(conn, "queues")
    steps = _steps(conn, "queues")
    # Then each step of the recursion is an index search, and the whole takes a few hundred
    # steps, not one per job
    assert not any(line.startswith("SCAN leaseq_jobs") for line in plan), plan
    assert steps * STEP < 2_000, (steps * STEP, plan)
    assert store.queues() == ["q0", "q1", "q2", "q3"]
