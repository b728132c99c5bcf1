"""What one round of a key-limited drain costs, without the worker.

    python -m bench.keyed_round [--store URL ...] [--rounds 200] [--repeats 3]

When a queue's key limit binds (10 keys × ``key_limit`` 4: 40 jobs at once), a slot is free
again only once its job's completion has committed, so every job goes round: claim, run,
complete. This times that round with nothing else in it, per store, on fresh queues of jobs
with no key, over 10 keys and over 100 keys (``key_limit`` 4): claim 40 (``Queue.claim``), run
them on 10 threads (a no-op each), complete the 40 (``Queue.complete_many``), again. It prints
the median claim and completion of 40 in ms, and the loop's jobs/s. A worker cannot drain a
key-bound queue faster than this loop: compare its "10 keys" rate with ``python -m bench
--scenario drain --scenario drain-keys`` (docs/benchmarks.md, ninth pass).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

import leaseq
from bench.__main__ import default_stores
from bench.targets import fresh, kind_of
from bench.tasks import KEY_LIMIT, KEYS, QUEUE, TASK, WIDE_KEYS

#: Jobs per claim and completion: the slots 10 keys × ``key_limit`` 4 hold.
BATCH = KEYS * KEY_LIMIT
#: Threads that run the claimed jobs (the worker's default concurrency).
SLOTS = 10
#: Rounds before the timed ones (statements prepared, caches warm).
WARM_UP = 20
#: The loops: their label and how many keys their jobs spread over (0: no key, no limit).
LOOPS = (("no key", 0), (f"{KEYS} keys, key_limit {KEY_LIMIT}", KEYS),
         (f"{WIDE_KEYS} keys, key_limit {KEY_LIMIT}", WIDE_KEYS))


@dataclass
class Round:
    claim_ms: float
    complete_ms: float
    jobs_s: float


def one_loop(url: str, keys: int, rounds: int, pool: ThreadPoolExecutor) -> Round:
    """``WARM_UP + rounds`` rounds on a fresh queue; the claim and completion medians and the
    timed rounds' jobs/s."""
    with fresh(url, "round") as target, leaseq.connect(target.url) as store:
        queue = store.queue(QUEUE, **({"key_limit": KEY_LIMIT} if keys else {}))
        total = BATCH * (WARM_UP + rounds)
        for start in range(0, total, 1000):
            queue.enqueue_many([
                queue.spec(f"j{i}", {"i": i}, task=TASK,
                           concurrency_key=f"key-{i % keys}" if keys else None)
                for i in range(start, min(start + 1000, total))])
        claims: list[float] = []
        completes: list[float] = []
        started = 0.0
        for turn in range(WARM_UP + rounds):
            if turn == WARM_UP:
                started = time.perf_counter()
            sent = time.perf_counter()
            jobs = queue.claim("bench-round", BATCH)
            claimed = time.perf_counter()
            if len(jobs) != BATCH:
                raise RuntimeError(f"claimed {len(jobs)} of {BATCH} jobs in round {turn}")
            list(pool.map(_no_op, jobs))
            ran = time.perf_counter()
            queue.complete_many(jobs)
            if turn >= WARM_UP:
                claims.append(claimed - sent)
                completes.append(time.perf_counter() - ran)
        elapsed = time.perf_counter() - started
    return Round(1000 * statistics.median(claims), 1000 * statistics.median(completes),
                 BATCH * rounds / elapsed)


def _no_op(job: leaseq.Job) -> str:
    return job.id


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.keyed_round", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", action="append", metavar="URL",
                   help="store URL (repeatable); default: as python -m bench")
    p.add_argument("--rounds", type=int, default=200, help="timed rounds per loop")
    p.add_argument("--repeats", type=int, default=3, help="loops per row (median shown)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    console = Console(width=None if sys.stdout.isatty() else 110)
    stores = args.store or default_stores(console)
    with ThreadPoolExecutor(SLOTS) as pool:
        for url in stores:
            table = Table(title=f"{kind_of(url)}: claim {BATCH}, run on {SLOTS} threads, "
                                f"complete {BATCH} — median of {args.repeats}")
            for column in ("jobs", "claim ms", "complete ms", "round jobs/s"):
                table.add_column(column, justify="left" if column == "jobs" else "right")
            for label, keys in LOOPS:
                runs = [one_loop(url, keys, args.rounds, pool) for _ in range(args.repeats)]
                table.add_row(label, _median(runs, lambda r: r.claim_ms, "{:.2f}"),
                              _median(runs, lambda r: r.complete_ms, "{:.2f}"),
                              _median(runs, lambda r: r.jobs_s, "{:,.0f}"))
            console.print(table)
    return 0


def _median(runs: list[Round], field: Callable[[Round], float], form: str) -> str:
    values = sorted(field(r) for r in runs)
    return (f"{form.format(statistics.median(values))} "
            f"[{form.format(values[0])}–{form.format(values[-1])}]")


if __name__ == "__main__":
    raise SystemExit(main())
