"""PostgreSQL-specific: at 1,000,000 jobs the claim still walks the partial index.

Slow (loading a million rows takes a while): run with ``pytest tests/postgres --slow`` or
``LEASEQ_SLOW=1``.
"""

from __future__ import annotations

import psycopg
import pytest

from leaseq.stores.postgres import PostgresStore

ROWS = 1_000_000

# A million jobs over four queues: a long history of done and failed jobs, 5% pending (some
# of them not yet due), a few processing. Only the live ones are in the partial index.
LOAD = """
INSERT INTO {schema}.jobs (queue, id, status, payload, attempts, max_attempts, lease_until,
                           lease_epoch, created_at, updated_at, first_seen_at)
SELECT 'q' || (i %% 4), 'job-' || lpad(i::text, 7, '0'),
       CASE WHEN i %% 20 = 0 THEN 'pending' WHEN i %% 97 = 1 THEN 'processing'
            WHEN i %% 50 = 1 THEN 'failed' ELSE 'done' END,
       '{{"n": 1}}'::json, 1, 5,
       CASE WHEN i %% 20 = 0 THEN now() + ((i %% 7200) - 3600) * interval '1 second'
            WHEN i %% 97 = 1 THEN now() + interval '10 minutes' END,
       1, now(), now(), now()
FROM generate_series(1, %(rows)s) AS i
"""


@pytest.mark.slow
def test_claim_uses_the_partial_index_at_a_million_jobs(store: PostgresStore, pg_url: str,
                                                       capsys: pytest.CaptureFixture) -> None:
    # Given a million jobs, analyzed
    schema = f'"{store.options.schema}"'
    with psycopg.connect(pg_url) as conn:
        conn.execute(LOAD.format(schema=schema), {"rows": ROWS})
        conn.commit()
        conn.execute(f"ANALYZE {schema}.jobs")
        # When the claim is planned, with its parameters and as the generic plan that a
        # prepared statement ends up with
        custom = _explain(conn, store.queries["claim"])
        conn.execute("SET plan_cache_mode = force_generic_plan")
        generic = _explain(conn, store.queries["claim"])
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


def _explain(conn: psycopg.Connection, query: str) -> list[str]:
    params = {"queue": "q0", "worker_id": "w1", "limit": 10, "lease_s": 900.0, "off": 0.0}
    return [r[0] for r in conn.execute("EXPLAIN " + query, params)]
