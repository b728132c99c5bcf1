"""The raw-SQL ceiling: a bare batched claim + complete loop on the same database.

No journal, no fencing token, no payload decoding, no retries: the least work a database-backed
queue can do per job with the same claim shape as leaseq. PostgreSQL claims with ``FOR UPDATE
SKIP LOCKED`` and completes the batch with one ``UPDATE … = ANY``; SQLite does the same two
statements, each under ``BEGIN IMMEDIATE``. It claims the batch leaseq's worker claims (its
slots plus its prefetch). leaseq's drain divided by this is "how close to the limit".

    python -m bench.ceiling worker KIND LOCATION --batch 16 [--burst]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import time

from bench.systems import System, WorkerSpec, python_argv

SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS bench_raw (
    id INTEGER PRIMARY KEY, status TEXT NOT NULL, payload TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, lease_until REAL);
CREATE INDEX IF NOT EXISTS bench_raw_ready ON bench_raw (id) WHERE status = 'pending';
"""
PG_SCHEMA = """
CREATE TABLE IF NOT EXISTS bench_raw (
    id bigint PRIMARY KEY, status text NOT NULL, payload jsonb NOT NULL,
    attempts int NOT NULL DEFAULT 0, lease_until timestamptz);
CREATE INDEX IF NOT EXISTS bench_raw_ready ON bench_raw (id) WHERE status = 'pending';
"""
PG_CLAIM = """
WITH c AS (SELECT id FROM bench_raw WHERE status = 'pending' ORDER BY id LIMIT %s
           FOR UPDATE SKIP LOCKED)
UPDATE bench_raw j SET status = 'processing', attempts = j.attempts + 1,
       lease_until = now() + interval '15 minutes'
FROM c WHERE j.id = c.id RETURNING j.id, j.payload
"""
PG_COMPLETE = ("UPDATE bench_raw SET status = 'done', lease_until = NULL "
               "WHERE id = ANY(%s) AND status = 'processing'")
SQLITE_CLAIM = """
UPDATE bench_raw SET status = 'processing', attempts = attempts + 1,
       lease_until = unixepoch('now') + 900
WHERE id IN (SELECT id FROM bench_raw WHERE status = 'pending' ORDER BY id LIMIT ?)
RETURNING id, payload
"""
SQLITE_COMPLETE = ("UPDATE bench_raw SET status = 'done', lease_until = NULL "
                   "WHERE id IN (SELECT value FROM json_each(?)) AND status = 'processing'")


def sqlite_connect(path: str) -> sqlite3.Connection:
    """The same settings as leaseq's SQLite store: WAL, synchronous NORMAL, busy timeout."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    conn.execute("PRAGMA busy_timeout = 30000")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


class RawSQLSystem(System):
    name = "raw-sql"
    kinds = ("sqlite", "postgresql")
    done_means = "status done"

    def open(self) -> None:
        if self.target.kind == "sqlite":
            self.conn = sqlite_connect(self.target.sqlite_path)  # type: ignore[arg-type]
            self.conn.executescript(SQLITE_SCHEMA)
        else:
            self.conn = self.target.pg_connect()
            self.conn.execute(PG_SCHEMA)

    def close(self) -> None:
        self.conn.close()

    def _insert(self, rows: list[tuple[int, str]]) -> None:
        if self.target.kind == "sqlite":
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.executemany("INSERT INTO bench_raw (id, status, payload) "
                                  "VALUES (?, 'pending', ?)", rows)
            self.conn.execute("COMMIT")
        else:
            self.conn.execute("INSERT INTO bench_raw (id, status, payload) "
                              "SELECT unnest(%s::bigint[]), 'pending', unnest(%s::jsonb[])",
                              ([r[0] for r in rows], [r[1] for r in rows]))

    def enqueue_each(self, first: int, count: int) -> None:
        for i in range(first, first + count):
            self._insert([(i, json.dumps({"i": i}))])

    def enqueue_bulk(self, first: int, count: int, batch: int) -> None:
        for start in range(first, first + count, batch):
            stop = min(start + batch, first + count)
            self._insert([(i, json.dumps({"i": i})) for i in range(start, stop)])

    def done_count(self) -> int:
        row = self.conn.execute("SELECT count(*) FROM bench_raw WHERE status = 'done'").fetchone()
        return int(row[0])  # type: ignore[index]

    def worker_argv(self, spec: WorkerSpec) -> list[str]:
        where = (self.target.sqlite_path if self.target.kind == "sqlite"
                 else f"{self.target.pg_conninfo} {self.target.pg_schema}")
        argv = python_argv("bench.ceiling", "worker", self.target.kind, str(where),
                           "--batch", str(worker_claim_batch(spec)))
        return [*argv, "--burst"] if spec.burst else argv


def worker_claim_batch(spec: WorkerSpec) -> int:
    """The batch leaseq's worker claims in a drain of no-op jobs: its slots plus its default
    prefetch (measured: 36–40 of the 42 a default worker may take), so the ceiling runs at the
    batch size the worker really uses."""
    from leaseq.worker import WorkerConfig

    defaults = WorkerConfig()
    return (spec.concurrency or defaults.concurrency) + defaults.prefetch


def work_sqlite(path: str, batch: int, burst: bool) -> None:
    conn = sqlite_connect(path)
    while True:
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(SQLITE_CLAIM, (batch,)).fetchall()
        conn.execute("COMMIT")
        if not rows:
            if burst:
                return
            time.sleep(0.001)
            continue
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(SQLITE_COMPLETE, (json.dumps([r[0] for r in rows]),))
        conn.execute("COMMIT")


def work_postgres(where: str, batch: int, burst: bool) -> None:
    import psycopg

    conninfo, schema = where.rsplit(" ", 1)
    with psycopg.connect(conninfo, autocommit=True,
                         options=f"-c search_path={schema}") as conn:
        while True:
            rows = conn.execute(PG_CLAIM, (batch,)).fetchall()
            if not rows:
                if burst:
                    return
                time.sleep(0.001)
                continue
            conn.execute(PG_COMPLETE, ([r[0] for r in rows],))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ceiling")
    p.add_argument("command", choices=["worker"])
    p.add_argument("kind", choices=["sqlite", "postgresql"])
    p.add_argument("where")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--burst", action="store_true")
    args = p.parse_args(argv)
    (work_sqlite if args.kind == "sqlite" else work_postgres)(args.where, args.batch, args.burst)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
