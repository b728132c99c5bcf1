"""Dashboard page timings on a big table: ``python -m bench.dashboard [--jobs N] [--store URL]``.

Seeds N jobs (default 1,000,000: 70 % done, 20 % pending, 6 % failed with errors, 4 %
cancelled, five tasks, updated over the last week) and one journal row per job, straight in
SQL (an enqueue per job would take most of the run), then asks every page of the dashboard
``--repeat`` times through its ASGI app and prints p50 / p95 per page. The overview's shared
stats snapshot is read afresh on every request here (``max_age_s=0``): the worst case, which a
real process pays at most once a second. The figure is in docs/dashboard.md.

Default stores: a SQLite file in a temporary folder, and PostgreSQL at
``postgresql://postgres@127.0.0.1:5432/test`` in a schema of its own that is dropped after.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable

from starlette.testclient import TestClient

import leaseq
from leaseq.dashboard import BasicAuth, create_app
from leaseq.dashboard.stats import StatsSnapshot
from leaseq.stores.base import Store

TASKS = ("export", "mail", "thumbnail", "invoice", "sync")
AUTH = {"Authorization": "Basic " + base64.b64encode(b"bench:bench").decode()}
PAGES = [
    ("overview", "/"),
    ("jobs, no filter", "/jobs?queue=bench"),
    ("jobs, next page", None),  # the cursor of the first page, filled in at run time
    ("jobs, status=failed", "/jobs?queue=bench&status=failed"),
    ("jobs, status+task", "/jobs?queue=bench&status=pending&task=mail"),
    ("jobs, task", "/jobs?queue=bench&task=invoice"),
    ("jobs, id prefix", "/jobs?queue=bench&id=job-0004"),
    ("jobs, error text", "/jobs?queue=bench&status=failed&error=mailbox"),
    ("jobs, time range", "/jobs?queue=bench&status=done&from=2020-01-01T00:00"),
    ("a job", "/job/bench/job-0000123"),
    ("quarantine", "/quarantine"),
    ("workers", "/workers"),
    ("health (doctor)", "/health"),
]

SQLITE_SEED = """
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {count} - 1)
INSERT INTO leaseq_jobs (queue, id, task, status, payload, attempts, max_attempts, lease_until,
    lease_epoch, error, failure, created_at, updated_at, first_seen_at)
SELECT 'bench', printf('job-%07d', i), {tasks},
       CASE WHEN i % 100 < 70 THEN 'done' WHEN i % 100 < 90 THEN 'pending'
            WHEN i % 100 < 96 THEN 'failed' ELSE 'cancelled' END,
       '{{"n":' || i || '}}', 1, 5, CASE WHEN i % 100 BETWEEN 70 AND 89 THEN {now} END, 1,
       CASE WHEN i % 100 BETWEEN 90 AND 95 THEN
            CASE WHEN i % 7 = 0 THEN 'SMTP 550 mailbox unavailable' ELSE 'timeout' END END,
       CASE WHEN i % 100 BETWEEN 90 AND 95 THEN 'exhausted' END,
       {now} - 604800 + i * 604800.0 / {count}, {now} - 604800 + i * 604800.0 / {count},
       {now} - 604800 + i * 604800.0 / {count}
FROM n;
INSERT INTO leaseq_journal (queue, job_id, at, event, attempt)
SELECT 'bench', id, updated_at, CASE status WHEN 'done' THEN 'result_saved'
    WHEN 'failed' THEN 'quarantined' ELSE 'enqueued' END, 1 FROM leaseq_jobs;
"""

POSTGRES_SEED = """
INSERT INTO {schema}.jobs (queue, id, task, status, payload, attempts, max_attempts,
    lease_until, lease_epoch, error, failure, created_at, updated_at, first_seen_at)
SELECT 'bench', 'job-' || lpad(i::text, 7, '0'), ({tasks_array})[1 + i % 5],
       CASE WHEN i % 100 < 70 THEN 'done' WHEN i % 100 < 90 THEN 'pending'
            WHEN i % 100 < 96 THEN 'failed' ELSE 'cancelled' END,
       json_build_object('n', i), 1, 5,
       CASE WHEN i % 100 BETWEEN 70 AND 89 THEN now() END, 1,
       CASE WHEN i % 100 BETWEEN 90 AND 95 THEN
            CASE WHEN i % 7 = 0 THEN 'SMTP 550 mailbox unavailable' ELSE 'timeout' END END,
       CASE WHEN i % 100 BETWEEN 90 AND 95 THEN 'exhausted' END,
       now() - interval '7 days' + i * interval '7 days' / {count},
       now() - interval '7 days' + i * interval '7 days' / {count},
       now() - interval '7 days' + i * interval '7 days' / {count}
FROM generate_series(0, {count} - 1) AS i;
INSERT INTO {schema}.journal (queue, job_id, at, event, attempt)
SELECT 'bench', id, updated_at, CASE status WHEN 'done' THEN 'result_saved'
    WHEN 'failed' THEN 'quarantined' ELSE 'enqueued' END, 1 FROM {schema}.jobs;
ANALYZE {schema}.jobs;
ANALYZE {schema}.journal;
"""


def seed_sqlite(path: str, count: int) -> Store:
    import sqlite3

    store = leaseq.connect(f"sqlite:///{path}")
    tasks = "CASE i % 5 " + " ".join(f"WHEN {n} THEN '{t}'" for n, t in enumerate(TASKS)) + " END"
    now = "((julianday('now') - 2440587.5) * 86400.0)"
    conn = sqlite3.connect(path)
    conn.executescript(SQLITE_SEED.format(count=count, tasks=tasks, now=now))
    conn.execute("ANALYZE")
    conn.commit()
    conn.close()
    return store


def seed_postgres(url: str, count: int) -> Store:
    schema = "bench_dash_" + uuid.uuid4().hex[:8]
    store = leaseq.connect(url, schema=schema)
    tasks = "ARRAY[" + ", ".join(f"'{t}'" for t in TASKS) + "]"
    sql = POSTGRES_SEED.format(schema=f'"{schema}"', count=count, tasks_array=tasks)
    store._session.run(lambda conn: conn.execute(sql))  # bench only: seeding in bulk
    return store


def measure(store: Store, repeat: int) -> list[tuple[str, float, float]]:
    app = create_app(store, auth=BasicAuth({"bench": "bench"}), permissions="all")
    app.state.dashboard.stats = StatsSnapshot(store, max_age_s=0.0)
    client = TestClient(app)
    store.register_worker("bench:1:00000001", ["bench"], 4)
    first = client.get(PAGES[1][1], headers=AUTH).text  # type: ignore[arg-type]
    cursor = first.split('id="next" href="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    rows = []
    for name, path in PAGES:
        url = path or cursor.removeprefix(str(client.base_url))
        rows.append((name, *_timings(lambda u=url: client.get(u, headers=AUTH), repeat)))
    return rows


def _timings(call: Callable[[], object], repeat: int) -> tuple[float, float]:
    call()  # warm the caches once, as a page that is used is
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = call()
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.status_code  # type: ignore[attr-defined]
    times.sort()
    return statistics.median(times), times[max(int(len(times) * 0.95) - 1, 0)]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--store", choices=("sqlite", "postgres"), action="append")
    parser.add_argument("--postgres-url", default=os.environ.get(
        "LEASEQ_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    args = parser.parse_args()
    for kind in args.store or ["sqlite", "postgres"]:
        with tempfile.TemporaryDirectory() as folder:
            started = time.perf_counter()
            store = (seed_sqlite(os.path.join(folder, "jobs.db"), args.jobs) if kind == "sqlite"
                     else seed_postgres(args.postgres_url, args.jobs))
            print(f"\n{kind}: {args.jobs:,} jobs seeded in {time.perf_counter() - started:.0f} s")
            try:
                print(f"{'page':24} {'p50 ms':>8} {'p95 ms':>8}")
                for name, p50, p95 in measure(store, args.repeat):
                    print(f"{name:24} {p50:8.1f} {p95:8.1f}")
            finally:
                if kind == "postgres":
                    store.drop()
                store.close()


if __name__ == "__main__":
    main()
