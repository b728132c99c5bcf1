"""Procrastinate (PostgreSQL) with its async psycopg connector: ``defer_async`` /
``batch_defer_async``, and ``run_worker_async(concurrency=N, wait=False)`` for burst. The
task is ``async def`` (its recommended shape for concurrency). "done" = status succeeded.

    python -m bench.adapters.procrastinate_adapter worker CONNINFO --concurrency 16 [--burst]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from urllib.parse import quote

from bench.systems import System, WorkerSpec, python_argv, record_start

QUEUE = "bench"


def make_app(conninfo: str):  # -> procrastinate.App
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name="noop", queue=QUEUE)
    async def noop(i: int) -> None:
        record_start(i)

    return app


class ProcrastinateSystem(System):
    name = "procrastinate"
    kinds = ("postgresql",)
    done_means = "status succeeded"

    @property
    def conninfo(self) -> str:
        options = quote(f"-c search_path={self.target.pg_schema}")
        return f"{self.target.pg_conninfo}?options={options}"

    def open(self) -> None:
        self._loop = asyncio.Runner()
        self.app = make_app(self.conninfo)
        self._loop.run(self._open())
        self._loop.run(self.app.schema_manager.apply_schema_async())
        self.task = self.app.tasks["noop"]

    async def _open(self) -> None:
        await self.app.open_async()

    def close(self) -> None:
        self._loop.run(self.app.close_async())
        self._loop.close()

    def enqueue_each(self, first: int, count: int) -> None:
        async def each() -> None:
            for i in range(first, first + count):
                await self.task.defer_async(i=i)

        self._loop.run(each())

    def enqueue_bulk(self, first: int, count: int, batch: int) -> None:
        async def bulk() -> None:
            for start in range(first, first + count, batch):
                stop = min(start + batch, first + count)
                await self.task.batch_defer_async(*({"i": i} for i in range(start, stop)))

        self._loop.run(bulk())

    def done_count(self) -> int:
        async def count() -> int:
            rows = await self.app.connector.execute_query_all_async(
                "SELECT count(*) AS n FROM procrastinate_jobs WHERE status = 'succeeded'")
            return int(rows[0]["n"])

        return self._loop.run(count())

    def worker_argv(self, spec: WorkerSpec) -> list[str]:
        argv = python_argv("bench.adapters.procrastinate_adapter", "worker", self.conninfo,
                           "--concurrency", str(spec.slots))
        return [*argv, "--burst"] if spec.burst else argv


async def work(conninfo: str, concurrency: int, burst: bool) -> None:
    app = make_app(conninfo)
    async with app.open_async():
        await app.run_worker_async(queues=[QUEUE], concurrency=concurrency, wait=not burst)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.adapters.procrastinate_adapter")
    p.add_argument("command", choices=["worker"])
    p.add_argument("conninfo")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--burst", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(work(args.conninfo, args.concurrency, args.burst))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
