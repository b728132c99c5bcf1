"""``leaseq doctor`` on PostgreSQL: a jobs table whose dead rows vacuum has not reclaimed is
found (from the statistics views, no scan of the table), and a freshly vacuumed one is not."""

from __future__ import annotations

import time

import psycopg

from leaseq.doctor import DoctorConfig, diagnose
from leaseq.stores.postgres import PostgresStore


def bloat(store: PostgresStore) -> list[str]:
    report = diagnose(store, DoctorConfig(dead_rows=5_000),
                      local_clock=lambda: store.server_now().timestamp())
    return [f.symptom for f in report.findings if f.check == "bloat"]


def test_dead_rows_vacuum_has_not_reclaimed_are_found(store: PostgresStore, pg_url: str) -> None:
    jobs = f'"{store.options.schema}".jobs'
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # Given 6,000 jobs, autovacuum off for this table, then every one updated once
        conn.execute(f"ALTER TABLE {jobs} SET (autovacuum_enabled = false)")
        conn.execute(f"""INSERT INTO {jobs} (queue, id, status, payload, max_attempts,
                         lease_until, created_at, updated_at, first_seen_at)
                         SELECT 'q', 'j' || i, 'done', '{{}}', 5, now(), now(), now(), now()
                         FROM generate_series(1, 6000) AS i""")
        conn.execute("VACUUM ANALYZE " + jobs)
        deadline = time.monotonic() + 30
        while not [t for t in store.table_health() if t.table == "jobs" and t.live_rows]:
            assert time.monotonic() < deadline, "statistics never showed the rows"
            time.sleep(0.05)
        assert bloat(store) == []  # vacuumed: healthy
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute(f"UPDATE {jobs} SET updated_at = now()")
    # When doctor runs, Then the jobs table's dead rows are a finding
    deadline = time.monotonic() + 30
    while not (found := bloat(store)):
        assert time.monotonic() < deadline, "no bloat finding"
        time.sleep(0.05)
    assert found[0].startswith("table jobs: 6,000 dead rows")
