"""leaseq's real worker through its Python API, for when the ``leaseq`` CLI is not installed:
the same ``Worker`` / supervisor that ``leaseq worker bench.tasks:app`` runs.

    python -m bench.leaseq_worker URL [--concurrency N] --processes 2 [--burst]
"""

from __future__ import annotations

import argparse
import logging

from leaseq.supervisor import run_processes, run_worker
from leaseq.worker import WorkerConfig

APP = "bench.tasks:app"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.leaseq_worker")
    p.add_argument("url")
    p.add_argument("--app", default=APP, help=f"MODULE:APP (default {APP})")
    p.add_argument("--concurrency", type=int, help="default: the worker's own")
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--burst", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    slots = {"concurrency": args.concurrency} if args.concurrency else {}
    config = WorkerConfig(burst=args.burst, **slots)
    if args.processes == 1:
        return run_worker(args.app, args.url, config)
    return run_processes(args.app, args.url, config, args.processes, logging.WARNING)


if __name__ == "__main__":
    raise SystemExit(main())
