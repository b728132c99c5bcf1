"""What one round of a key-limited drain costs, without the worker.

    python -m bench.keyed_round [--store URL ...] [--rounds 200] [--repeats 3] [--lanes N ...]

When a queue's key limit binds (10 keys × ``key_limit`` 4: 40 jobs at once), a slot is free
again only once its job's completion has committed, so every job goes round: claim, run,
complete. This times that round with nothing else in it, per store, on fresh queues of jobs
with no key, over 10 keys and over 100 keys (``key_limit`` 4): claim 40 (``Queue.claim``), run
them on 10 threads (a no-op each), complete the 40 (``Queue.complete_many``), again. It prints
the median claim and completion of 40 in ms, and the loop's jobs/s. A worker cannot drain a
key-bound queue faster than this loop: compare its "10 keys" rate with ``python -m bench
--scenario drain --scenario drain-keys`` (docs/benchmarks.md, ninth and tenth passes).

``--lanes N`` (repeatable) adds a row for the 10-key loop split into N lanes that run at once,
each on its own connection: claim ``40 / N``, run, complete, again. It shows whether claims
and completions that overlap (one lane claims while another completes) beat the lockstep
round: the 40 slots are the same, the statements smaller.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

import leaseq
from bench.__main__ import default_stores, tool_parser
from bench.stats import Summary
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


def one_loop(url: str, keys: int, rounds: int, pool: ThreadPoolExecutor,
             lanes: int = 1) -> Round:
    """``WARM_UP + rounds`` rounds in each of ``lanes`` lanes on a fresh queue (each lane
    claims ``BATCH // lanes``); the claim and completion medians over every lane, and the
    timed rounds' jobs/s, from the moment every lane has warmed up."""
    with fresh(url, "round") as target:
        needed = BATCH * (WARM_UP + rounds)
        with leaseq.connect(target.url) as store:
            # Lanes need not take their keys in turn, as one lockstep claim does: half as many
            # jobs again, so that no key runs dry before the last round.
            fill(_queue(store, keys), keys, needed if lanes == 1 else needed * 3 // 2)
        warm = threading.Barrier(lanes + 1)
        with ThreadPoolExecutor(lanes) as runs:
            times = [runs.submit(_lane, target.url, keys, BATCH // lanes, rounds, warm, pool)
                     for _ in range(lanes)]
            with contextlib.suppress(threading.BrokenBarrierError):  # a lane failed: below
                warm.wait()
            started = time.perf_counter()
            claims, completes = _gather(times)
            elapsed = time.perf_counter() - started
    return Round(1000 * statistics.median(claims), 1000 * statistics.median(completes),
                 BATCH // lanes * lanes * rounds / elapsed)


def _queue(store: leaseq.Store, keys: int) -> leaseq.Queue:
    return store.queue(QUEUE, **({"key_limit": KEY_LIMIT} if keys else {}))


def fill(queue: leaseq.Queue, keys: int, total: int) -> None:
    """Enqueue ``total`` no-op jobs ``j0``… spread over ``keys`` keys in turn (0: no key)."""
    for start in range(0, total, 1000):
        queue.enqueue_many([
            queue.spec(f"j{i}", {"i": i}, task=TASK,
                       concurrency_key=f"key-{i % keys}" if keys else None)
            for i in range(start, min(start + 1000, total))])


def _lane(url: str, keys: int, batch: int, rounds: int, warm: threading.Barrier,
          pool: ThreadPoolExecutor) -> tuple[list[float], list[float]]:
    """One lane's rounds on its own connection: claim ``batch``, run, complete; waits at
    ``warm`` after its warm-up rounds. The timed rounds' claim and completion times (s)."""
    claims: list[float] = []
    completes: list[float] = []
    try:
        with leaseq.connect(url) as store:
            queue = _queue(store, keys)
            for turn in range(WARM_UP + rounds):
                if turn == WARM_UP:
                    warm.wait()
                sent = time.perf_counter()
                jobs = queue.claim("bench-round", batch)
                claimed = time.perf_counter()
                if len(jobs) != batch:  # the lanes together never hold more than 40 slots
                    raise RuntimeError(f"claimed {len(jobs)} of {batch} jobs in round {turn}")
                list(pool.map(_no_op, jobs))
                ran = time.perf_counter()
                queue.complete_many(jobs)
                if turn >= WARM_UP:
                    claims.append(claimed - sent)
                    completes.append(time.perf_counter() - ran)
    except BaseException:
        warm.abort()  # no lane, nor the timer, waits for this one
        raise
    return claims, completes


def _gather(lanes: list[Future[tuple[list[float], list[float]]]]) -> tuple[list[float],
                                                                            list[float]]:
    """Every lane's claim and completion times; a lane's failure raised as itself, not as the
    broken barrier the other lanes met."""
    errors = [error for lane in lanes if (error := lane.exception()) is not None]
    if errors:
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)),
                   errors[0])
    claims: list[float] = []
    completes: list[float] = []
    for lane in lanes:
        lane_claims, lane_completes = lane.result()
        claims += lane_claims
        completes += lane_completes
    return claims, completes


def _no_op(job: leaseq.Job) -> str:
    return job.id


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = tool_parser("keyed_round", __doc__)
    p.add_argument("--rounds", type=int, default=200, help="timed rounds per loop")
    p.add_argument("--repeats", type=int, default=3, help="loops per row (median shown)")
    p.add_argument("--lanes", type=int, action="append", default=[], metavar="N",
                   choices=[n for n in range(2, BATCH + 1) if BATCH % n == 0],
                   help=f"also the {KEYS}-key loop in N lanes at once (repeatable; N divides "
                        f"{BATCH})")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    console = Console(width=None if sys.stdout.isatty() else 110)
    stores = args.store or default_stores(console)
    loops = [(label, keys, 1) for label, keys in LOOPS] + [
        (f"{KEYS} keys, key_limit {KEY_LIMIT}, {n} lanes of {BATCH // n}", KEYS, n)
        for n in args.lanes]
    with ThreadPoolExecutor(SLOTS) as pool:
        for url in stores:
            in_lanes = f" (a lane: its share of {BATCH})" if args.lanes else ""
            table = Table(title=f"{kind_of(url)}: claim {BATCH}, run on {SLOTS} threads, "
                                f"complete {BATCH}{in_lanes} — median of {args.repeats}")
            for column in ("jobs", "claim ms", "complete ms", "round jobs/s"):
                table.add_column(column, justify="left" if column == "jobs" else "right")
            for label, keys, lanes in loops:
                runs = [one_loop(url, keys, args.rounds, pool, lanes)
                        for _ in range(args.repeats)]
                table.add_row(label, _median(runs, lambda r: r.claim_ms, "{:.2f}"),
                              _median(runs, lambda r: r.complete_ms, "{:.2f}"),
                              _median(runs, lambda r: r.jobs_s, "{:,.0f}"))
            console.print(table)
    return 0


def _median(runs: list[Round], field: Callable[[Round], float], form: str) -> str:
    return Summary.of([field(r) for r in runs]).text(form)


if __name__ == "__main__":
    raise SystemExit(main())
