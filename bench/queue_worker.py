"""A minimal worker on the low-level ``Queue`` API: claim a batch, run, complete each.

The drain scenarios use leaseq's real worker (``leaseq worker``) when it is installed; this
stand-in keeps the harness testable without it and is a reference point for the worker's own
overhead (``python -m bench --worker queue-api``).

    python -m bench.queue_worker URL --concurrency 16 [--burst] [--poll-s 0.005] [--key-limit N]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import uuid

import leaseq
from bench.systems import record_start
from bench.tasks import QUEUE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.queue_worker")
    parser.add_argument("url")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--burst", action="store_true")
    parser.add_argument("--poll-s", type=float, default=0.005)
    parser.add_argument("--key-limit", type=int, help="the queue's key_limit (keyed drain)")
    args = parser.parse_args(argv)
    stopping = []
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    with leaseq.connect(args.url) as store:
        limits = {"key_limit": args.key_limit} if args.key_limit else {}
        queue = store.queue(QUEUE, **limits)
        while not stopping:
            jobs = queue.claim(worker_id, args.concurrency)
            if not jobs:
                if args.burst:
                    break
                store.wait_for_work([QUEUE], args.poll_s)
                continue
            for job in jobs:
                record_start(job.payload["i"])
                queue.complete(job)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
