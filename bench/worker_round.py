"""Where leaseq's worker spends its round on a key-bound queue.

    python -m bench.worker_round [--store URL ...] [--jobs 10000] [--repeats 3]

Over 10 keys with ``key_limit`` 4 a worker's claim comes back with the 40 jobs the keys' slots
hold, and the worker goes round in lockstep: claim 40, start them, run them on its 10 slots,
write their completions in one batch, claim again. This runs the real worker (``Worker``, in
this process, burst, default settings) over ``--jobs`` such jobs and times each round's parts
from the store calls it makes and its handlers' start stamps:

- claim: the claim call, from sent to returned;
- to first start: from the claim's return to the first handler start after it;
- run: from there to the completion write being sent (40 jobs through 10 slots);
- write: the completion write (``complete_many``);
- to next claim: from the write's return to the next claim being sent.

Only lockstep rounds (a claim, one write, the next claim) are counted; the table says how many
of the store calls made them. ``python -m bench.keyed_round`` times the claim and the write
alone, with no worker around them (docs/benchmarks.md, tenth pass).
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

import leaseq
from bench.__main__ import default_stores, tool_parser
from bench.keyed_round import fill
from bench.stats import Summary
from bench.targets import fresh, kind_of
from bench.tasks import KEY_LIMIT, KEYS, QUEUE, TASK
from leaseq.app import App
from leaseq.worker import Worker, WorkerConfig

#: The parts of a round, in order, as the table names them.
PARTS = ("claim", "to first start", "run", "write", "to next claim")


@dataclass(frozen=True)
class Call:
    kind: str  # "claim" or "write"
    sent: float
    returned: float


@dataclass
class Drain:
    parts_ms: dict[str, float]  # each part's median over the lockstep rounds
    rounds: int
    calls: int
    jobs_s: float


def one_drain(url: str, jobs: int) -> Drain:
    """The worker's burst drain of ``jobs`` jobs over ``KEYS`` keys on a fresh queue."""
    with fresh(url, "worker_round") as target, leaseq.connect(target.url) as store:
        app = App(store=store, queues={QUEUE: {"key_limit": KEY_LIMIT}})
        starts: list[float] = []

        @app.task(name=TASK, queue=QUEUE)
        def noop(i: int) -> None:
            starts.append(time.perf_counter())  # list.append: safe from the slots' threads

        fill(app.queue(QUEUE), KEYS, jobs)
        calls: list[Call] = []
        # On this store object only: the worker's claims and its completer's writes.
        store.claim = _timed(store.claim, "claim", calls)  # type: ignore[method-assign]
        store.complete_many = _timed(  # type: ignore[method-assign]
            store.complete_many, "write", calls)
        started = time.perf_counter()
        Worker(app, WorkerConfig(burst=True)).run()
        elapsed = time.perf_counter() - started
    rounds = _lockstep_rounds(sorted(calls, key=lambda c: c.sent), sorted(starts))
    if not rounds:
        raise RuntimeError(f"no lockstep round among {len(calls)} store calls")
    return Drain({part: 1000 * statistics.median(r[i] for r in rounds)
                  for i, part in enumerate(PARTS)}, len(rounds), len(calls), jobs / elapsed)


def _timed(call: Callable[..., Any], kind: str, calls: list[Call]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        sent = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            calls.append(Call(kind, sent, time.perf_counter()))

    return timed


def _lockstep_rounds(calls: list[Call], starts: list[float]) -> list[tuple[float, ...]]:
    """Each claim followed by one write and then the next claim, split into ``PARTS`` (s)."""
    rounds = []
    for claim, write, after in zip(calls, calls[1:], calls[2:], strict=False):
        if (claim.kind, write.kind, after.kind) != ("claim", "write", "claim"):
            continue
        first = bisect.bisect_left(starts, claim.returned)
        if first == len(starts) or starts[first] > write.sent:
            continue  # no handler of this claim started before the write (an empty claim)
        rounds.append((claim.returned - claim.sent, starts[first] - claim.returned,
                       write.sent - starts[first], write.returned - write.sent,
                       after.sent - write.returned))
    return rounds


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = tool_parser("worker_round", __doc__)
    p.add_argument("--jobs", type=int, default=10_000, help="jobs per drain")
    p.add_argument("--repeats", type=int, default=3, help="drains per store (median shown)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    console = Console(width=None if sys.stdout.isatty() else 110)
    for url in args.store or default_stores(console):
        drains = [one_drain(url, args.jobs) for _ in range(args.repeats)]
        table = Table(title=f"{kind_of(url)}: the worker's round over {KEYS} keys, key_limit "
                            f"{KEY_LIMIT}, {args.jobs:,} jobs — median of {args.repeats} drains")
        for column in ("part of the round", "ms"):
            table.add_column(column, justify="left" if column != "ms" else "right")
        for part in PARTS:
            table.add_row(part, _median([d.parts_ms[part] for d in drains], "{:.2f}"))
        table.add_row("whole round", _median([sum(d.parts_ms.values()) for d in drains],
                                             "{:.2f}"))
        table.add_row("jobs/s, worker start to exit",
                      _median([d.jobs_s for d in drains], "{:,.0f}"))
        table.add_row("lockstep rounds / store calls",
                      " ".join(f"{d.rounds}/{d.calls}" for d in drains))
        console.print(table)
    return 0


def _median(values: list[float], form: str) -> str:
    return Summary.of(values).text(form)


if __name__ == "__main__":
    raise SystemExit(main())
