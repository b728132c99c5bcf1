"""``leaseq doctor`` on PostgreSQL: a jobs table whose dead rows vacuum has not reclaimed is
found (from the statistics views, no scan of the table), and a freshly vacuumed one is not; an
index left mostly empty is found (estimated from the catalog), and a rebuilt one is not."""

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


def index_bloat(store: PostgresStore) -> list[tuple[str, str]]:
    # A 0.1 MB floor: the test's index is a few MB, the default floor 8 MB.
    report = diagnose(store, DoctorConfig(index_min_bytes=100_000),
                      local_clock=lambda: store.server_now().timestamp())
    assert "index_bloat" in report.checks_run
    return [(f.symptom, f.action) for f in report.findings if f.check == "index_bloat"]


def test_an_index_vacuum_left_mostly_empty_is_found_and_a_rebuilt_one_is_not(
        store: PostgresStore, pg_url: str) -> None:
    schema = store.options.schema
    jobs = f'"{schema}".jobs'
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # Given 20,000 jobs with random ids, 7 in 8 of them deleted, then VACUUM ANALYZE: the
        # dead entries are gone, the pages that held them stay (the catalog says so at once)
        conn.execute(f"ALTER TABLE {jobs} SET (autovacuum_enabled = false)")
        conn.execute(f"""INSERT INTO {jobs} (queue, id, status, payload, max_attempts,
                         lease_until, created_at, updated_at, first_seen_at)
                         SELECT 'q', md5(i::text), 'done', '{{}}', 5, now(), now(), now(), now()
                         FROM generate_series(1, 20000) AS i""")
        conn.execute(f"DELETE FROM {jobs} WHERE right(id, 1) NOT IN ('0', '1')")
        conn.execute("VACUUM ANALYZE " + jobs)
        # When doctor runs, Then the primary key is a finding, with the REINDEX to run
        found = index_bloat(store)
        pkey = [(s, a) for s, a in found if s.startswith("index jobs_pkey on jobs:")]
        assert pkey, found
        assert pkey[0][1].startswith(f"REINDEX INDEX CONCURRENTLY {schema}.jobs_pkey")
        # And once the table's indexes are rebuilt, none is
        conn.execute("REINDEX TABLE " + jobs)
    assert index_bloat(store) == []
    sizes = {i.index: i.size_bytes for i in store.index_health()}
    assert sizes["jobs_pkey"] > 0  # still estimated, not left out
