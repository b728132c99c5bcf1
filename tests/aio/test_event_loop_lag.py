"""Nothing the async API does holds the event loop: 1,000 ``aenqueue`` calls run next to a
1 ms ticker, and the ticker's worst lag stays within 20 ms of what the machine itself costs.

The machine is shared and loaded, and a busy process on a loaded machine waits tens of
milliseconds for a CPU (measured here: 50-100 ms with four other test runs going), which is
the kernel's lag, not leaseq's. So the measuring thread (and the worker thread it starts)
runs under the real-time scheduler where the test may use it (root; restored after), and
the test also subtracts what leaseq does not cause: before each run the same ticker runs
alone for as long, and its worst lag is added to the 20 ms allowance. A run that still
exceeds it is tried again, at most three times: a store call made on the loop (a blocking
``aenqueue``) holds it for the whole batch (about 0.6 s for 1,000 jobs on SQLite, measured),
so it fails every run, where a scheduling spike does not repeat three times in a row.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from leaseq import Queue
from leaseq.stores.base import Store

JOBS = 1_000
PRODUCERS = 10
TICK_S = 0.001
ALLOWANCE_S = 0.020


async def _ticker(stop: asyncio.Event, lags: list[float]) -> None:
    loop = asyncio.get_running_loop()
    due = loop.time() + TICK_S
    while not stop.is_set():
        await asyncio.sleep(max(due - loop.time(), 0))
        now = loop.time()
        lags.append(now - due)
        due = now + TICK_S


async def _worst_lag_while(work: asyncio.Future | None, duration_s: float = 0) -> float:
    stop = asyncio.Event()
    lags: list[float] = []
    ticker = asyncio.create_task(_ticker(stop, lags))
    await asyncio.sleep(0.01)  # the ticker is running before the work starts
    if work is not None:
        await work
    else:
        await asyncio.sleep(duration_s)
    stop.set()
    await ticker
    return max(lags)


async def _produce(q: Queue, run: int) -> None:
    async def producer(p: int) -> None:
        for i in range(JOBS // PRODUCERS):
            await q.aenqueue(f"r{run}-p{p}-{i}", {"i": i})
    await asyncio.gather(*(producer(p) for p in range(PRODUCERS)))


@contextmanager
def _real_time_thread() -> Iterator[None]:
    """This thread (and the threads it starts meanwhile) under SCHED_FIFO, when allowed."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (AttributeError, PermissionError, OSError):
        yield  # not allowed here: the baseline and the three tries carry the test
        return
    try:
        yield
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def test_a_thousand_aenqueue_never_hold_the_event_loop(store: Store) -> None:
    q = Queue(store, "lag")

    async def attempt(run: int) -> tuple[float, float]:
        started = time.monotonic()
        worst = await _worst_lag_while(asyncio.ensure_future(_produce(q, run)))
        took = time.monotonic() - started
        baseline = await _worst_lag_while(None, took)
        return worst, baseline

    async def scenario() -> list[tuple[float, float]]:
        seen = []
        for run in range(3):
            worst, baseline = await attempt(run)
            seen.append((worst, baseline))
            if worst <= ALLOWANCE_S + baseline:
                break
        await store.aclose()
        return seen

    with _real_time_thread():
        seen = asyncio.run(scenario())
    worst, baseline = seen[-1]
    assert worst <= ALLOWANCE_S + baseline, (
        f"worst ticker lag {worst * 1000:.1f} ms next to {JOBS} aenqueue calls; the ticker "
        f"alone lagged {baseline * 1000:.1f} ms (every run: "
        f"{[(round(w * 1000, 1), round(b * 1000, 1)) for w, b in seen]})")
    assert q.counts()["pending"] >= JOBS
