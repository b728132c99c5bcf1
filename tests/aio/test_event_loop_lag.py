"""Nothing the async API does holds the event loop: 1,000 ``aenqueue`` calls run next to a
1 ms ticker, and the ticker's worst lag stays within 20 ms.

The test removes the lag that is not leaseq's, so the 20 ms can be asserted flat:

* **The kernel's.** A busy process on a loaded machine waits tens of milliseconds for a CPU:
  on the shared 2-core machine with three CPU-bound processes running, this test's ticker
  lagged up to 440 ms under the normal scheduler, 3 ms at most under the real-time one (40
  runs each). So every thread of this process runs under ``SCHED_FIFO`` for the measured
  part, threads started meanwhile too (they inherit it): a store thread holding the GIL is
  then not preempted by another process while the loop waits for it.
* **The garbage collector's.** A full collection walks the whole test process (pytest's and
  every earlier test's objects), which leaseq does not own: the heap is frozen
  (``gc.freeze``) and collection disabled for the measured part.

A store call made on the loop (a blocking ``aenqueue``) holds it for the whole batch, about
0.6 s for 1,000 jobs on SQLite: far past 20 ms.

Real-time scheduling needs root or ``CAP_SYS_NICE``. Without it a wall clock cannot tell the
kernel's lag from leaseq's on a loaded machine, so the bound becomes relative: 20 ms plus the
worst lag of the same ticker running alone just after, for as long. Either way a run over its
bound is tried again, at most three times: a blocking ``aenqueue`` fails every run, a
scheduling spike (under real time, the virtual machine's host stalling it) does not repeat
three times in a row. The test says which bound it asserted.
"""

from __future__ import annotations

import asyncio
import gc
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
#: Runs before a lag over the bound fails the test: a blocking ``aenqueue`` lags every run, a
#: scheduling spike (the kernel's, or under real time the virtual machine's host) not three
#: in a row.
TRIES = 3


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


def _threads() -> list[int]:
    return [int(tid) for tid in os.listdir("/proc/self/task")]


def _set_policy(tid: int, policy: int, priority: int) -> None:
    try:
        os.sched_setscheduler(tid, policy, os.sched_param(priority))
    except ProcessLookupError:
        pass  # the thread ended


@contextmanager
def _real_time_process() -> Iterator[bool]:
    """Every thread of this process under ``SCHED_FIFO`` (threads started meanwhile inherit
    it); yields whether that was allowed (Linux, with root or ``CAP_SYS_NICE``). Every
    thread is back under its own policy after (a thread started meanwhile: the normal one)."""
    try:
        before = {tid: (os.sched_getscheduler(tid), os.sched_getparam(tid).sched_priority)
                  for tid in _threads()}
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (AttributeError, OSError):  # no such call, no /proc, or not allowed
        yield False
        return
    try:
        for tid in before:
            _set_policy(tid, os.SCHED_FIFO, 10)
        yield True
    finally:
        for tid in _threads():
            _set_policy(tid, *before.get(tid, (os.SCHED_OTHER, 0)))


@contextmanager
def _no_collection() -> Iterator[None]:
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def _assert_flat(q: Queue, store: Store) -> None:
    async def scenario() -> list[float]:
        seen = []
        for run in range(TRIES):  # a virtual machine's host can still stall us: not 3 times
            with _no_collection():
                seen.append(await _worst_lag_while(asyncio.ensure_future(_produce(q, run))))
            if seen[-1] <= ALLOWANCE_S:
                break
        await store.aclose()
        return seen

    seen = asyncio.run(scenario())
    assert seen[-1] <= ALLOWANCE_S, (
        f"worst ticker lag {seen[-1] * 1000:.1f} ms next to {JOBS} aenqueue calls (real-time "
        f"scheduling, no garbage collection: the lag is the async API's; every run: "
        f"{[round(w * 1000, 1) for w in seen]} ms)")


def _assert_relative(q: Queue, store: Store) -> None:
    async def attempt(run: int) -> tuple[float, float]:
        with _no_collection():
            started = time.monotonic()
            worst = await _worst_lag_while(asyncio.ensure_future(_produce(q, run)))
            baseline = await _worst_lag_while(None, time.monotonic() - started)
        return worst, baseline

    async def scenario() -> list[tuple[float, float]]:
        seen = []
        for run in range(TRIES):
            seen.append(await attempt(run))
            if seen[-1][0] <= ALLOWANCE_S + seen[-1][1]:
                break
        await store.aclose()
        return seen

    seen = asyncio.run(scenario())
    worst, baseline = seen[-1]
    assert worst <= ALLOWANCE_S + baseline, (
        f"no real-time scheduling here; worst ticker lag {worst * 1000:.1f} ms next to {JOBS} "
        f"aenqueue calls, the ticker alone lagged {baseline * 1000:.1f} ms (every run: "
        f"{[(round(w * 1000, 1), round(b * 1000, 1)) for w, b in seen]})")


def test_a_thousand_aenqueue_never_hold_the_event_loop(store: Store) -> None:
    q = Queue(store, "lag")
    with _real_time_process() as real_time:
        if real_time:
            _assert_flat(q, store)
        else:
            _assert_relative(q, store)
    assert q.counts()["pending"] >= JOBS
