"""PostgreSQL-specific: the outbox's walk and the queue list read what they return, not the
table. (Store-specific because it reads PostgreSQL's own plans; the SQLite twin is
tests/unit/test_sqlite_plans.py.)

A broker backlog is the realistic shape: most pending jobs are published and wait for a
consumer, a few are owed a publish, and a history of finished jobs lies behind them. Without
jobs_outbox (built by the dispatcher's ``prepare_outbox``) the dispatcher's every round walked
the whole published backlog, and before its loose index scan ``queues()`` (sweeper, metrics)
read every job.
"""

from __future__ import annotations

import psycopg
import pytest
from plan_reading import analyze, rows_read, scans

from leaseq.stores.postgres import PostgresStore

ROWS = 20_000

# Four queues; a third finished, the rest pending and published except one in 500 (owed).
LOAD = """
INSERT INTO {schema}.jobs (queue, id, status, payload, attempts, max_attempts, lease_until,
                           lease_epoch, created_at, updated_at, first_seen_at, published_at)
SELECT 'q' || (i %% 4), 'job-' || lpad(i::text, 7, '0'),
       CASE WHEN i %% 3 = 0 THEN 'done' ELSE 'pending' END, '{{}}'::json, 0, 5,
       now() - (i %% 600) * interval '1 second', 0, now(), now(), now(),
       CASE WHEN i %% 500 <> 1 THEN now() END
FROM generate_series(1, %(rows)s) AS i
"""


@pytest.fixture
def backlog(store: PostgresStore, pg_url: str) -> psycopg.Connection:
    schema = f'"{store.options.schema}"'
    conn = psycopg.connect(pg_url)
    conn.execute(LOAD.format(schema=schema), {"rows": ROWS})
    conn.commit()
    conn.execute(f"ANALYZE {schema}.jobs")
    conn.commit()
    yield conn
    conn.close()


def test_outbox_due_reads_only_the_jobs_owed_a_publish(store: PostgresStore,
                                                       backlog: psycopg.Connection) -> None:
    # Given 20,000 jobs, 13,000 of them published and waiting for a consumer, in a schema
    # whose outbox no dispatcher has prepared yet: no jobs_outbox to walk
    params = {"queue": "q1", "limit": 10, "off": 0.0}
    before = analyze(backlog, store.queries["outbox_due"], params)
    assert "jobs_outbox" not in " ".join(scans(before)), scans(before)
    # When a dispatcher starts (it prepares the outbox), then asks for the next jobs owed a
    # publish
    store.prepare_outbox()
    plan = analyze(backlog, store.queries["outbox_due"], params)
    # Then the statement reads about as many index entries as it returns, none of the backlog
    assert rows_read(plan) <= 2 * params["limit"], (rows_read(plan), scans(plan))
    assert scans(plan) == ["Index Scan using jobs_outbox"], scans(plan)
    # And they are the owed ones, in not-before order
    due = store.outbox_due("q1", 10)
    assert len(due) == 10 and all(job.published_at is None for job in due)
    assert [job.lease_until for job in due] == sorted(job.lease_until for job in due)


def test_queues_reads_one_index_entry_per_queue(store: PostgresStore,
                                                backlog: psycopg.Connection) -> None:
    # Given 20,000 jobs over four queues
    # When the sweeper or the metrics list the queues
    plan = analyze(backlog, store.queries["queues"], {"off": 0.0})
    # Then one index probe per queue (and one past the last) is all it reads
    assert rows_read(plan) <= 2 * 5, (rows_read(plan), scans(plan))
    assert "Seq Scan" not in scans(plan), scans(plan)
    assert store.queues() == ["q0", "q1", "q2", "q3"]

