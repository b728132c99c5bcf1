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

from leaseq.journal import HOURLY_UNCOUNTED
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


# Limits in the claim (issue 17): the same 20,000 jobs with five priorities; those of queue q2
# carry one of 40 concurrency keys.
KEYED = """
UPDATE leaseq_jobs SET priority = (CAST(substr(id, 5) AS INTEGER) / 4) % 5,
       concurrency_key = CASE WHEN queue = 'q2'
                              THEN 'tenant-' || ((CAST(substr(id, 5) AS INTEGER) / 4) % 40) END
"""


@pytest.fixture
def keyed(backlog: tuple[SQLiteStore, sqlite3.Connection]
          ) -> tuple[SQLiteStore, sqlite3.Connection]:
    store, conn = backlog
    conn.execute(KEYED)
    conn.commit()
    return store, conn


def test_the_claim_with_priorities_walks_the_index_from_the_top_priority(
        keyed: tuple[SQLiteStore, sqlite3.Connection]) -> None:
    # Given 3,300 pending jobs of q1 over five priorities
    store, conn = keyed
    params = {"queue": "q1", "limit": 10, "worker_id": "w1", "lease_s": 60.0}
    # When the claim is planned and run
    plan = _plan(conn, "claim", **params)
    steps = _steps(conn, "claim", **params)
    conn.rollback()  # the claim wrote: leave the jobs to the store
    # Then it searches the claimable index and does work for its 10 jobs, not the backlog
    assert any("USING INDEX leaseq_jobs_claimable" in line for line in plan), plan
    assert steps * STEP < 3_000, (steps * STEP, plan)
    # And the next jobs are of the top priority
    assert [job.priority for job in store.queue("q1").claim("w2", limit=5)] == [4] * 5


def test_the_key_limited_claim_seeks_each_key_not_its_backlog(
        keyed: tuple[SQLiteStore, sqlite3.Connection]) -> None:
    # Given 3,300 pending jobs of q2 over 40 keys (about 80 each)
    store, conn = keyed
    params = {"queue": "q2", "key_limit": 2, "limit": 10, "scan": 30, "worker_id": "w1",
              "lease_s": 60.0}
    # When a key-limited claim is planned and run (one statement)
    plan = _plan(conn, "claim_keyed", **params)
    conn.execute("BEGIN")  # a statement opening with WITH gets no implicit transaction
    steps = _steps(conn, "claim_keyed", **params)
    conn.rollback()  # the claim wrote: leave the jobs to the store
    # Then the keys come from a loose scan of the keyed index, the running counts and each
    # key's first jobs from theirs: work per key, not per job
    assert any("USING INDEX leaseq_jobs_keyed (queue=? AND concurrency_key>?)" in line
               for line in plan), plan
    assert any("leaseq_jobs_keyed_running" in line for line in plan), plan
    assert any("USING INDEX leaseq_jobs_keyed (queue=? AND concurrency_key=?)" in line
               for line in plan), plan
    # (about 400 steps a key, the same with four times the backlog; walking the backlog
    # would take some 30 a job)
    assert steps * STEP < 40 * 500, (steps * STEP, plan)
    # And a real claim takes at most key_limit jobs of each key, highest priority first
    jobs = store.queue("q2", key_limit=2).claim("w1", limit=200)
    per_key: dict[str | None, int] = {}
    for job in jobs:
        per_key[job.concurrency_key] = per_key.get(job.concurrency_key, 0) + 1
    assert len(jobs) == 80 and set(per_key.values()) == {2}, per_key


def _statements_of_a_claim(store: SQLiteStore, key_limit: int, limit: int
                           ) -> tuple[list[str], int, list[str | None]]:
    """Claim from q2 under ``key_limit``: the named statements the store ran, the virtual
    machine's steps they took (in units of ``STEP``), and the claimed jobs' keys."""
    names: list[str] = []
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    rows = store._rows

    def recorded(conn: sqlite3.Connection, name: str, **params: object) -> list[dict[str, object]]:
        names.append(name)
        return rows(conn, name, **params)

    store._rows = recorded  # type: ignore[method-assign]
    store._conn.set_progress_handler(count, STEP)
    try:
        jobs = store.queue("q2", key_limit=key_limit).claim("w1", limit=limit)
    finally:
        store._conn.set_progress_handler(None, 0)
        del store._rows
    return names, steps, [job.concurrency_key for job in jobs]


def test_the_key_limited_claim_takes_the_queues_front_when_the_limits_let_it_run(
        keyed: tuple[SQLiteStore, sqlite3.Connection]) -> None:
    # Given 3,300 pending jobs of q2 over 40 keys, none running
    store, _ = keyed
    # When a key-limited claim of 10 runs
    names, steps, keys = _statements_of_a_claim(store, key_limit=2, limit=10)
    # Then it reads the front of the queue and those jobs' keys, and claims from them: work
    # for its jobs and their keys, as the plain claim does, not a seek for each of 40 keys
    assert "claim_keyed" not in names and "claim_rowids" in names, names
    assert steps * STEP < 6_000, (steps * STEP, names)
    # And the limit holds
    assert len(keys) == 10 and max(keys.count(key) for key in keys) <= 2, keys


def test_the_key_limited_claim_walks_every_key_when_full_keys_fill_the_front(
        keyed: tuple[SQLiteStore, sqlite3.Connection]) -> None:
    # Given q2's jobs of its top priority all of one key, with two of that key running
    store, conn = keyed
    conn.execute("UPDATE leaseq_jobs SET priority = 9, concurrency_key = 'hot' "
                 "WHERE queue = 'q2' AND rowid IN (SELECT rowid FROM leaseq_jobs "
                 "WHERE queue = 'q2' AND status = 'pending' LIMIT 100)")
    conn.commit()
    assert len(store.queue("q2", key_limit=2).claim("w0", limit=2)) == 2
    # When a claim of 5 finds its front (30 jobs) all of that full key
    names, _, keys = _statements_of_a_claim(store, key_limit=2, limit=5)
    # Then it walks every key and claims jobs of the others
    assert "claim_keyed" in names, names
    assert len(keys) == 5 and "hot" not in keys, keys


# The hourly counts (journal_hourly) over a journal of 20,000 enqueues and claims and five
# quarantines, all in the hour now running.
JOURNAL = """
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :rows)
INSERT INTO leaseq_journal (queue, job_id, at, event)
SELECT 'q1', printf('job-%07d', i / 2), unixepoch('now'),
       CASE WHEN i <= 5 THEN 'quarantined' WHEN i % 2 = 0 THEN 'enqueued' ELSE 'claimed' END
FROM n
"""


def test_hourly_counts_read_only_the_events_they_count(
        backlog: tuple[SQLiteStore, sqlite3.Connection]) -> None:
    # Given a journal of 20,000 enqueues and claims and five quarantines
    store, conn = backlog
    conn.execute(JOURNAL, {"rows": ROWS})
    conn.commit()
    # When the hourly counts are planned and run
    plan = _plan(conn, "journal_hourly", queue="q1", hours=1)
    steps = _steps(conn, "journal_hourly", queue="q1", hours=1)
    (definition,) = conn.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'leaseq_journal_at'").fetchone()
    # Then they search the partial index, which leaves the enqueues and claims out: work for
    # five rows, not for the journal
    assert any("USING COVERING INDEX leaseq_journal_at" in line for line in plan), plan
    assert steps * STEP < 500, (steps * STEP, plan)
    assert all(f"'{event}'" in definition for event in HOURLY_UNCOUNTED), definition
    assert [(c.event, c.count) for c in store.journal_hourly("q1", 1)] == [("quarantined", 5)]
    # And so do the counts of the last hour (the dashboard's overview)
    window = _plan(conn, "journal_counts", queue="q1", within_s=3600.0)
    assert any("USING COVERING INDEX leaseq_journal_at" in line for line in window), window
    assert _steps(conn, "journal_counts", queue="q1", within_s=3600.0) * STEP < 500
    assert store.journal_counts("q1", 3600) == {"quarantined": 5}
