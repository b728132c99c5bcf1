"""Huey's ``SqliteHuey`` with its defaults (WAL), a thread consumer of N workers, no periodic
tasks. Huey has no bulk enqueue (each call is its own insert) and no burst mode (the consumer
is stopped with SIGINT, its graceful signal). Huey keeps no record of a finished task that
returns nothing, so "done" = enqueued − still queued; for a no-op task that is finished
within microseconds of being dequeued.

    python -m bench.adapters.huey_adapter worker PATH --workers 16
"""

from __future__ import annotations

import argparse

from bench.systems import System, WorkerSpec, python_argv, record_start


def make_huey(path: str):  # -> (huey.SqliteHuey, task)
    from huey import SqliteHuey

    huey = SqliteHuey(name="bench", filename=path)

    @huey.task(name="noop")
    def noop(i: int) -> None:
        record_start(i)

    return huey, noop


class HueySystem(System):
    name = "huey"
    kinds = ("sqlite",)
    has_burst = False
    done_means = "enqueued − still queued (no record of finished no-op tasks)"

    def open(self) -> None:
        self.huey, self.task = make_huey(str(self.target.sqlite_path))
        self.enqueued = 0

    def close(self) -> None:
        self.huey.storage.close()

    def enqueue_each(self, first: int, count: int) -> None:
        task = self.task
        for i in range(first, first + count):
            task(i)
        self.enqueued += count

    def enqueue_bulk(self, first: int, count: int, batch: int) -> None:
        self.enqueue_each(first, count)  # no bulk API: the runner does not time this

    def done_count(self) -> int:
        return self.enqueued - self.huey.pending_count()

    def worker_argv(self, spec: WorkerSpec) -> list[str]:
        return python_argv("bench.adapters.huey_adapter", "worker", str(self.target.sqlite_path),
                           "--workers", str(spec.slots))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.adapters.huey_adapter")
    p.add_argument("command", choices=["worker"])
    p.add_argument("path")
    p.add_argument("--workers", type=int, default=16)
    args = p.parse_args(argv)
    # Huey names a task after its module: import it under its package name, not __main__.
    from bench.adapters.huey_adapter import make_huey as make

    huey, _ = make(args.path)
    huey.create_consumer(workers=args.workers, worker_type="thread", periodic=False).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
