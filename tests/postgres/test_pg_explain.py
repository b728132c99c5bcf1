"""PostgreSQL-specific: at 1,000,000 jobs the claim and the outbox still walk their partial
indexes, and the queue list still reads one index entry per queue. The claim does so with
five priorities, and the key-limited claim (issue 17) with 50 keys: a few probes per key.

Slow (loading a million rows takes a while): run with ``pytest tests/postgres --slow`` or
``LEASEQ_SLOW=1``.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from plan_reading import analyze, rows_read, scans

from leaseq.limits import UNKEYED_SCAN
from leaseq.stores.postgres import PostgresStore

ROWS = 1_000_000

# A million jobs over four queues: a long history of done and failed jobs, 5% pending (some
# of them not yet due), a few processing. Only the live ones are in the claim's partial index.
# As in broker mode, most pending jobs are published (waiting for a consumer) and one in 20 is
# owed a publish: only those are in the outbox's index, once a dispatcher has built it. Jobs
# have five priorities; every other job of queue q0 has one of 50 concurrency keys.
LOAD = """
INSERT INTO {schema}.jobs (queue, id, status, payload, attempts, max_attempts, lease_until,
                           lease_epoch, created_at, updated_at, first_seen_at, published_at,
                           priority, concurrency_key)
SELECT 'q' || (i %% 4), 'job-' || lpad(i::text, 7, '0'),
       CASE WHEN i %% 20 = 0 THEN 'pending' WHEN i %% 97 = 1 THEN 'processing'
            WHEN i %% 50 = 1 THEN 'failed' ELSE 'done' END,
       '{{"n": 1}}'::json, 1, 5,
       CASE WHEN i %% 20 = 0 THEN now() + ((i %% 7200) - 3600) * interval '1 second'
            WHEN i %% 97 = 1 THEN now() + interval '10 minutes' END,
       1, now(), now(), now(),
       CASE WHEN i %% 20 = 0 AND i %% 400 <> 0 THEN now() END,
       (i / 20) %% 5,
       CASE WHEN i %% 40 = 0 THEN 'tenant-' || ((i / 40) %% 50) END
FROM generate_series(1, %(rows)s) AS i
"""


@pytest.fixture
def million(store: PostgresStore, pg_url: str) -> Iterator[psycopg.Connection]:
    """A million jobs, analyzed; a connection to plan on."""
    schema = f'"{store.options.schema}"'
    with psycopg.connect(pg_url) as conn:
        conn.execute(LOAD.format(schema=schema), {"rows": ROWS})
        conn.commit()
        conn.execute(f"ANALYZE {schema}.jobs")
        conn.commit()
        yield conn


@pytest.mark.slow
def test_claim_uses_the_partial_index_at_a_million_jobs(store: PostgresStore,
                                                       million: psycopg.Connection,
                                                       capsys: pytest.CaptureFixture) -> None:
    # Given a million jobs, analyzed
    # When the claim is planned, with its parameters and as the generic plan that a prepared
    # statement ends up with
    custom, generic = _both_plans(million, store.queries["claim"])
    # Then its inner SELECT walks jobs_claimable in order; nothing scans the table
    for plan in (custom, generic):
        text = "\n".join(plan)
        assert "Seq Scan" not in text, text
        index_lines = [line.strip() for line in plan if "jobs_claimable" in line]
        assert index_lines[0].startswith("->  Index Scan using jobs_claimable"), text
    with capsys.disabled():
        print(f"\nclaim plan at {ROWS:,} jobs: {index_lines[0]}")
    # And a real claim takes due jobs in not-before order
    jobs = store.queue("q0").claim("w1", limit=10)
    assert len(jobs) == 10


@pytest.mark.slow
def test_outbox_due_uses_its_partial_index_at_a_million_jobs(
        store: PostgresStore, million: psycopg.Connection,
        capsys: pytest.CaptureFixture) -> None:
    # Given a million jobs, 47,500 of them published and waiting for a consumer, and a
    # dispatcher that prepared the outbox when it started (it builds jobs_outbox)
    store.prepare_outbox()
    # When the dispatcher's outbox read is planned (with parameters, and generic)
    custom, generic = _both_plans(million, store.queries["outbox_due"])
    # Then it walks jobs_outbox in order; nothing scans the table or the published backlog
    for plan in (custom, generic):
        text = "\n".join(plan)
        assert "Seq Scan" not in text, text
        index_lines = [line.strip() for line in plan if "jobs_outbox" in line]
        assert index_lines and index_lines[0].startswith("->  Index Scan using jobs_outbox"), text
    # And run, it reads about as many index entries as it returns
    million.execute("RESET plan_cache_mode")
    ran = analyze(million, store.queries["outbox_due"], _PARAMS)
    assert rows_read(ran) <= 2 * _PARAMS["limit"], (rows_read(ran), scans(ran))
    with capsys.disabled():
        print(f"\noutbox_due plan at {ROWS:,} jobs: {index_lines[0]}; "
              f"{rows_read(ran)} rows read")
    assert len(store.outbox_due("q0", 10)) == 10


@pytest.mark.slow
def test_queues_is_a_loose_index_scan_at_a_million_jobs(
        store: PostgresStore, million: psycopg.Connection,
        capsys: pytest.CaptureFixture) -> None:
    # Given a million jobs over four queues
    # When the queue list is read
    ran = analyze(million, store.queries["queues"], {"off": 0.0})
    # Then it reads one index entry per queue (and finds none past the last), not the table
    assert "Seq Scan" not in scans(ran), scans(ran)
    assert rows_read(ran) <= 2 * 5, (rows_read(ran), scans(ran))
    with capsys.disabled():
        print(f"\nqueues at {ROWS:,} jobs: {rows_read(ran)} rows read by {sorted(set(scans(ran)))}"
              f" in {ran['Actual Total Time']:.3f} ms")
    assert store.queues() == ["q0", "q1", "q2", "q3"]


@pytest.mark.slow
def test_the_claim_with_priorities_reads_about_what_it_takes(
        store: PostgresStore, million: psycopg.Connection,
        capsys: pytest.CaptureFixture) -> None:
    # Given a million jobs, the 12,500 pending ones of q0 spread over five priorities, half of
    # them not yet due
    # When the claim runs
    million.execute("SET plan_cache_mode = force_custom_plan")
    ran = analyze(million, store.queries["claim"], _PARAMS)
    # Then it walks jobs_claimable from the top priority and stops at its limit
    assert "Seq Scan" not in scans(ran), scans(ran)
    assert rows_read(ran) <= 3 * _PARAMS["limit"], (rows_read(ran), scans(ran))
    with capsys.disabled():
        print(f"\nclaim with priorities at {ROWS:,} jobs: {rows_read(ran)} rows read")
    # And the jobs come highest priority first
    jobs = [store.queue("q0").claim("w1")[0] for _ in range(3)]
    assert [j.priority for j in jobs] == [4, 4, 4]


@pytest.mark.slow
def test_the_key_limited_claim_probes_each_key_at_a_million_jobs(
        store: PostgresStore, million: psycopg.Connection,
        capsys: pytest.CaptureFixture) -> None:
    # Given a million jobs, half of those of q0 over 50 keys (about 130 live ones per key, a
    # few of them processing: every key is full)
    # When the key-limited claim runs, planned with its parameters and as a generic plan
    params = {**_PARAMS, "key_limit": 2, "scan": 10 + UNKEYED_SCAN}
    custom, generic = _both_plans(million, store.queries["claim_keyed"], params)
    # Then nothing scans the table, and the keys come from their index
    for plan in (custom, generic):
        text = "\n".join(plan)
        assert "Seq Scan" not in text, text
        assert "jobs_keyed" in text and "jobs_keyed_running" in text, text
    # And run, it reads a few index entries per key (its running count stops at key_limit),
    # not the keys' backlogs
    million.execute("SET plan_cache_mode = force_custom_plan")
    ran = analyze(million, store.queries["claim_keyed"], params)
    assert rows_read(ran) <= 8 * 50 + params["scan"] + 4 * params["limit"], (
        rows_read(ran), scans(ran))
    with capsys.disabled():
        print(f"\nkey-limited claim at {ROWS:,} jobs, 50 keys: {rows_read(ran)} rows read in "
              f"{ran['Actual Total Time']:.3f} ms")
    # And once the running jobs have finished, a real claim takes at most key_limit jobs of
    # each key
    million.execute(f'UPDATE "{store.options.schema}".jobs SET status = %s '
                    "WHERE queue = 'q0' AND status = 'processing'", ["done"])
    million.commit()
    jobs = store.queue("q0", key_limit=2).claim("w1", limit=200)
    per_key: dict[str | None, int] = {}
    for job in jobs:
        per_key[job.concurrency_key] = per_key.get(job.concurrency_key, 0) + 1
    unkeyed = per_key.pop(None, 0)
    # 2 of each of the 50 keys, and the jobs without a key found near the front
    assert set(per_key.values()) == {2} and len(per_key) == 50, per_key
    assert unkeyed > 0 and len(jobs) == 100 + unkeyed


_PARAMS = {"queue": "q0", "worker_id": "w1", "limit": 10, "lease_s": 900.0, "off": 0.0,
           "token": None}


def _both_plans(conn: psycopg.Connection, query: str,
                params: dict[str, object] = _PARAMS) -> tuple[list[str], list[str]]:
    """The plan with its parameters, and the generic plan a prepared statement ends up with."""
    custom = _explain(conn, query, params)
    conn.execute("SET plan_cache_mode = force_generic_plan")
    try:
        return custom, _explain(conn, query, params)
    finally:
        conn.execute("RESET plan_cache_mode")


def _explain(conn: psycopg.Connection, query: str, params: dict[str, object]) -> list[str]:
    return [r[0] for r in conn.execute("EXPLAIN " + query, params)]
