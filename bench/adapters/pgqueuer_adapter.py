"""PgQueuer (PostgreSQL) on asyncpg, its recommended driver: batch enqueue with one call,
``QueueManager`` worker with ``batch_size`` = our concurrency and drain mode for burst.

A finished PgQueuer job is deleted from its queue table (and logged), so "done" here is
jobs enqueued − rows left in ``pgqueuer``.

    python -m bench.adapters.pgqueuer_adapter worker DSN SCHEMA --batch 16 [--burst]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import timedelta

from bench.systems import System, WorkerSpec, python_argv, record_start

ENTRYPOINT = "noop"


async def _connect(dsn: str, schema: str):  # -> asyncpg.Connection
    import asyncpg

    return await asyncpg.connect(dsn, server_settings={"search_path": schema})


class PgQueuerSystem(System):
    name = "pgqueuer"
    kinds = ("postgresql",)
    done_means = "enqueued − rows left in the queue table"

    def open(self) -> None:
        from pgqueuer import Queries

        self._loop = asyncio.Runner()
        self.conn = self._loop.run(_connect(self.target.pg_conninfo, self.target.pg_schema))
        self.queries = Queries.from_asyncpg_connection(self.conn)
        self._loop.run(self.queries.install())
        self.enqueued = 0

    def close(self) -> None:
        self._loop.run(self.conn.close())
        self._loop.close()

    def enqueue_each(self, first: int, count: int) -> None:
        async def each() -> None:
            for i in range(first, first + count):
                await self.queries.enqueue(ENTRYPOINT, json.dumps({"i": i}).encode(), 0)

        self._loop.run(each())
        self.enqueued += count

    def enqueue_bulk(self, first: int, count: int, batch: int) -> None:
        async def bulk() -> None:
            for start in range(first, first + count, batch):
                ids = range(start, min(start + batch, first + count))
                await self.queries.enqueue([ENTRYPOINT] * len(ids),
                                           [json.dumps({"i": i}).encode() for i in ids],
                                           [0] * len(ids))

        self._loop.run(bulk())
        self.enqueued += count

    def done_count(self) -> int:
        left = self._loop.run(self.conn.fetchval("SELECT count(*) FROM pgqueuer"))
        return self.enqueued - int(left)

    def worker_argv(self, spec: WorkerSpec) -> list[str]:
        argv = python_argv("bench.adapters.pgqueuer_adapter", "worker",
                           str(self.target.pg_conninfo), str(self.target.pg_schema),
                           "--batch", str(spec.slots))
        return [*argv, "--burst"] if spec.burst else argv


async def work(dsn: str, schema: str, batch: int, burst: bool) -> None:
    from pgqueuer import PgQueuer
    from pgqueuer.domain.types import QueueExecutionMode

    pgq = PgQueuer.from_asyncpg_connection(await _connect(dsn, schema))

    @pgq.entrypoint(ENTRYPOINT)
    async def noop(job) -> None:  # type: ignore[no-untyped-def]
        record_start(json.loads(job.payload)["i"])

    mode = QueueExecutionMode.drain if burst else QueueExecutionMode.continuous
    await pgq.run(batch_size=batch, mode=mode, dequeue_timeout=timedelta(seconds=30))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.adapters.pgqueuer_adapter")
    p.add_argument("command", choices=["worker"])
    p.add_argument("dsn")
    p.add_argument("schema")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--burst", action="store_true")
    args = p.parse_args(argv)
    try:
        import uvloop

        uvloop.run(work(args.dsn, args.schema, args.batch, args.burst))
    except ImportError:
        asyncio.run(work(args.dsn, args.schema, args.batch, args.burst))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
