"""PostgreSQL-specific: no statement keeps a plan made while the table was young.

(Store-specific because plan caching is PostgreSQL's.) A generic plan is made once per
prepared statement; made over an empty table (a worker polling before any job exists) it
picks sequential scans and keeps them as the queue grows — claims ran 60x slower until
autovacuum's next ANALYZE. The store's connections plan every run instead.
"""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest
from plan_reading import analyze, rows_read, scans

from leaseq.browse import JobFilter
from leaseq.job import Completion
from leaseq.journal import HOURLY_UNCOUNTED
from leaseq.limits import UNKEYED_SCAN
from leaseq.stores.postgres import PostgresStore


def test_hot_statements_never_run_a_generic_plan(store: PostgresStore) -> None:
    # Given a worker that polled an empty queue many times, then finished a trickle of jobs
    q = store.queue("young")
    for _ in range(12):
        assert q.claim("w1") == []
    for i in range(12):
        q.enqueue(f"t{i}", {"i": i})
        jobs = q.claim("w1")
        store.heartbeat_many("young", [job.lease for job in jobs], 30)
        store.complete_many("young", [Completion(job.lease) for job in jobs])
    # When the queue then grows
    q.enqueue_many([q.spec(f"j{i}", {"i": i}) for i in range(2000)])
    (job,) = q.claim("w1", limit=1)
    q.complete(job)
    # Then every statement the store prepared was planned for the rows it met, each run
    rows = store._session.run(lambda conn: conn.execute(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements").fetchall(),
        autocommit=True)
    assert rows, "the hot statements are prepared"
    assert all(generic == 0 for generic, _ in rows)


def test_the_key_limited_claim_never_runs_a_generic_plan(store: PostgresStore) -> None:
    # Given a worker that polled an empty key-limited queue many times (a generic plan made
    # then would walk each key in jobs_claimable, not jobs_keyed), then claimed a trickle
    q = store.queue("young_keyed", key_limit=2)
    for _ in range(12):
        assert q.claim("w1") == []
    for i in range(12):
        q.enqueue(f"t{i}", {"i": i}, concurrency_key=f"k{i % 3}", priority=i % 2)
        q.complete_many(q.claim("w1"))
    # When the queue then grows
    q.enqueue_many([q.spec(f"j{i}", {"i": i}, concurrency_key=f"k{i % 10}")
                    for i in range(2000)])
    assert len(q.claim("w1", limit=30)) == 20  # 10 keys, 2 each
    # Then the keyed claim was planned for the rows it met, each run
    rows = store._session.run(lambda conn: conn.execute(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
        "WHERE statement LIKE '%%RECURSIVE keys%%'").fetchall(), autocommit=True)
    assert rows, "the keyed claim is prepared"
    assert all(generic == 0 for generic, _ in rows)


def test_the_key_limited_claim_on_a_young_table_reads_about_what_it_takes(
        store: PostgresStore) -> None:
    # Given a key-limited queue filled at once, never analyzed (a queue of "a few rows" to the
    # planner), 4,000 jobs over 10 keys, some of them processing
    q = store.queue("young_keyed", key_limit=4)
    q.enqueue_many([q.spec(f"j{i}", {"i": i}, concurrency_key=f"k{i % 10}")
                    for i in range(4000)])
    assert len(q.claim("w1", limit=20)) == 20
    # When the key-limited claim runs for the keys' free slots
    params = {"queue": "young_keyed", "worker_id": "w2", "limit": 40, "lease_s": 30.0,
              "off": 0.0, "key_limit": 4, "scan": 40 + UNKEYED_SCAN, "token": None}
    ran = store._session.run(lambda conn: analyze(conn, store.queries["claim_keyed"], params))
    # Then it reads a few entries per key, and locks and updates the jobs it chose one by one
    # (a primary-key probe each, then the row version it locked): not by reading the whole
    # queue, nor a range of the claim index per job
    assert rows_read(ran) <= 400, (rows_read(ran), scans(ran))
    assert "Index Scan using jobs_pkey" in scans(ran) and "Tid Scan" in scans(ran), scans(ran)
    assert "Bitmap Heap Scan" not in scans(ran) and "Seq Scan" not in scans(ran), scans(ran)
    assert scans(ran).count("Index Scan using jobs_claimable") == 1, scans(ran)


def test_indexed_text_columns_compare_bytes(store: PostgresStore) -> None:
    # Given a migrated schema, When its text columns' collations are read
    rows = store._session.run(lambda conn: conn.execute(
        "SELECT c.relname || '.' || a.attname, coalesce(co.collname, '') "
        "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "LEFT JOIN pg_collation co ON co.oid = a.attcollation "
        "WHERE n.nspname = %s AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped "
        "AND a.atttypid = 'text'::regtype",
        [store.options.schema]).fetchall(), idempotent=True)
    collations = dict(rows)
    # Then every text column an index compares sorts by bytes (never through strcoll)
    for column in ("jobs.queue", "jobs.id", "jobs.status", "jobs.task", "jobs.concurrency_key",
                   "journal.queue", "journal.job_id", "journal.event"):
        assert collations[column] == "C", (column, collations[column])


def test_hourly_counts_read_only_the_events_they_count(store: PostgresStore, pg_url: str) -> None:
    # Given 3,000 jobs enqueued and claimed (6,000 journal rows) and three quarantined
    q = store.queue("hourly")
    q.enqueue_many([q.spec(f"j{i}", {"i": i}) for i in range(3000)])
    claimed = []
    while jobs := q.claim("w1", limit=500):
        claimed += jobs
    for job in claimed[:3]:
        q.fail(job, "boom")
    schema = f'"{store.options.schema}"'
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"ANALYZE {schema}.journal")
        # When the hourly counts are planned and run
        plan = analyze(conn, store.queries["journal_hourly"], {"queue": "hourly", "hours": 1,
                                                               "off": 0.0})
        window = analyze(conn, store.queries["journal_counts"], {
            "queue": "hourly", "within_s": 3600.0, "off": 0.0})
        (definition,) = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = %s AND indexname = 'journal_at'",
            (store.options.schema,)).fetchone() or ("",)
    # Then they read the journal_at index, which holds the three quarantines and not the
    # enqueues and claims they leave out
    assert scans(plan) == ["Index Only Scan using journal_at"]
    assert rows_read(plan) == 3
    assert all(f"'{event}'" in definition for event in HOURLY_UNCOUNTED), definition
    assert [(c.event, c.count) for c in store.journal_hourly("hourly", 1)] == [("quarantined", 3)]
    # And so do the counts of the last hour (the dashboard's overview)
    assert scans(window) == ["Index Only Scan using journal_at"]
    assert rows_read(window) == 3
    assert store.journal_counts("hourly", 3600) == {"quarantined": 3}


def test_a_filter_by_task_alone_walks_the_primary_key_in_id_order(store: PostgresStore,
                                                                   pg_url: str) -> None:
    # Given 3,000 jobs, one in 100 of task "rare", in a schema without a task index
    q = store.queue("tasks")
    q.enqueue_many([q.spec(f"j{i:05d}", {"i": i}, task="rare" if i % 100 == 7 else "common")
                    for i in range(3000)])
    schema = f'"{store.options.schema}"'
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"ANALYZE {schema}.jobs")
        indexes = [r[0] for r in conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = %s", (store.options.schema,))]
        # When the browser's walk for a task alone is planned and run
        plan = analyze(conn, store.queries["walk_ids"], {
            "queue": "tasks", "task": "rare", "error": None,
            "since": datetime(2000, 1, 1, tzinfo=UTC), "until": datetime(2100, 1, 1, tzinfo=UTC),
            "after_id": "", "low": "",
            "high": "\U0010ffff" * 2, "n": 500, "off": 0.0})
    # Then it reads the primary key from the cursor on, no more rows than it was asked for
    assert "jobs_task" not in indexes
    assert scans(plan) == ["Index Scan using jobs_pkey"]
    assert rows_read(plan) == 500
    # And the pages it makes list the task's jobs in id order
    page = store.find_jobs(JobFilter("tasks", task="rare"), limit=50)
    assert [job.id for job in page.jobs] == [f"j{i:05d}" for i in range(7, 3000, 100)]


def test_a_purge_deletes_in_batches_each_its_own_statement(
        store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given 5 old done jobs, and purges of 2 jobs a statement (PURGE_BATCH, made small)
    import leaseq.stores.postgres.store as pg_store

    q = store.queue("old")
    q.enqueue_many([q.spec(f"j{i}", {}) for i in range(5)])
    q.complete_many(q.claim("w", limit=5))
    store.time_offset_s += 100
    monkeypatch.setattr(pg_store, "PURGE_BATCH", 2)
    batches: list[tuple[int, int]] = []
    batch = store._purge_batch

    def counted(*args: object) -> tuple[int, int]:
        batches.append(batch(*args))  # type: ignore[arg-type]
        return batches[-1]

    monkeypatch.setattr(store, "_purge_batch", counted)
    # When they are purged, Then three statements delete 2, 2 and 1 (one statement deleted
    # every job at once: on a first retention over millions, past its call's deadline)
    assert q.purge(done=50) == 5
    assert batches == [(2, 2), (2, 2), (1, 1)]
    assert q.counts() == {} and q.journal("j0") == []


def test_a_purge_batch_thinned_out_by_another_purge_is_not_the_last(
        store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given batches as two sweepers' purges make them: of the jobs a batch found, the other
    # purge deleted some first (or a requeue took them out), so it deleted fewer
    import leaseq.stores.postgres.store as pg_store

    monkeypatch.setattr(pg_store, "PURGE_BATCH", 2)
    answers = iter([(1, 2), (2, 2), (0, 1)])  # (deleted, found)
    calls: list[str] = []

    def scripted(queue: str, status: str, age_s: float) -> tuple[int, int]:
        calls.append(status)
        return next(answers)

    monkeypatch.setattr(store, "_purge_batch", scripted)
    # When it purges, Then it goes on while a batch found as many as it may take (it had
    # stopped after the first, with most of the aged jobs left)
    assert store.purge("old", {"done": 50}) == 3
    assert calls == ["done", "done", "done"]
