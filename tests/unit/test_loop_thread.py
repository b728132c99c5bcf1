"""``runner.LoopThread``, the loop of ``async def`` handlers: a coroutine handed to it just as
it stops is cancelled or run, never left unstarted in a stopped loop (the cause of "coroutine
... was never awaited", and of a caller waiting for ever on its future)."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any

from leaseq.runner import LoopThread

#: Bound on every wait in this file (the loop answers in microseconds).
WAIT_S = 10.0


async def _value(n: int) -> int:
    return n


def _block_loop(loops: LoopThread) -> threading.Event:
    """Hold the loop's thread in a callback until the returned event is set: what is handed
    to the loop meanwhile waits in its queue, as it does on a busy loop."""
    running, release = threading.Event(), threading.Event()

    async def hold() -> None:
        running.set()
        release.wait(WAIT_S)  # blocks the loop's thread on purpose

    loops.submit(hold())
    assert running.wait(WAIT_S)
    return release


def test_a_coroutine_handed_over_before_the_stop_ends_not_dropped() -> None:
    loops = LoopThread()
    release = _block_loop(loops)
    coro = _value(1)
    future = loops.submit(coro)  # queued behind the blocked callback
    loops.stop()  # its stop is queued after it
    release.set()
    loops.join(WAIT_S)
    assert future.done(), "the coroutine was left in the stopped loop's queue"
    assert future.cancelled() or future.result(0) == 1
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED


def test_the_stop_cancels_a_handler_that_awaits_and_closes_the_loop() -> None:
    loops = LoopThread()
    started = threading.Event()
    cancelled = threading.Event()

    async def waits() -> None:
        started.set()
        try:
            await asyncio.sleep(WAIT_S)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    future = loops.submit(waits())
    assert started.wait(WAIT_S)
    loops.stop()
    loops.join(WAIT_S)
    assert cancelled.is_set()
    assert future.cancelled()
    thread = loops._thread
    assert thread is not None and not thread.is_alive()


def test_the_stop_awaits_on_stop_on_the_loop_after_its_tasks_ended() -> None:
    # Given a loop whose stop closes what its handlers opened (the store's aclose)
    seen: list[tuple[str, asyncio.AbstractEventLoop | None]] = []
    handler_ended = threading.Event()

    async def close() -> None:
        seen.append(("closed, the handler ended" if handler_ended.is_set() else "too soon",
                     asyncio.get_running_loop()))

    loops = LoopThread(on_stop=close)

    async def handler() -> None:
        try:
            await asyncio.sleep(WAIT_S)
        finally:
            handler_ended.set()

    loop_of: Future[asyncio.AbstractEventLoop] = loops.submit(_loop_of())
    loops.submit(handler())
    ran_on = loop_of.result(WAIT_S)
    # When it stops, Then on_stop runs once, on that loop, after the handler was cancelled
    loops.stop()
    loops.join(WAIT_S)
    assert seen == [("closed, the handler ended", ran_on)]


def test_a_failing_on_stop_still_closes_the_loop() -> None:
    async def close() -> None:
        raise RuntimeError("the server went away")

    loops = LoopThread(on_stop=close)
    assert loops.submit(_value(1)).result(WAIT_S) == 1
    loops.stop()
    loops.join(WAIT_S)
    thread = loops._thread
    assert thread is not None and not thread.is_alive()


async def _loop_of() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def test_a_submit_after_the_stop_runs_on_a_new_loop() -> None:
    loops = LoopThread()
    assert loops.submit(_value(1)).result(WAIT_S) == 1
    loops.stop()
    loops.join(WAIT_S)
    assert loops.submit(_value(2)).result(WAIT_S) == 2
    loops.stop()
    loops.join(WAIT_S)


def test_submits_racing_a_stop_are_each_run_or_cancelled() -> None:
    """Threads submit while another stops the loop: every future ends, every coroutine is
    closed (run to its end or cancelled), and every loop's thread ends."""
    for _ in range(50):
        _race_submits_with_a_stop()


def _race_submits_with_a_stop(submitters: int = 4, each: int = 20) -> None:
    loops = LoopThread()
    loops.submit(_value(0)).result(WAIT_S)  # the loop is up before the race starts
    first_thread = loops._thread
    go = threading.Barrier(submitters + 1)
    handed: list[tuple[Coroutine[Any, Any, int], Future[int]]] = []
    lock = threading.Lock()

    def submit_some() -> None:
        go.wait(WAIT_S)
        for n in range(each):
            coro = _value(n)
            future = loops.submit(coro)
            with lock:
                handed.append((coro, future))

    def stop() -> None:
        go.wait(WAIT_S)
        loops.stop()

    threads = [threading.Thread(target=submit_some) for _ in range(submitters)]
    threads.append(threading.Thread(target=stop))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    loops.stop()  # the loop a late submit started, if any
    loops.join(WAIT_S)
    assert first_thread is not None
    first_thread.join(WAIT_S)
    assert not first_thread.is_alive()
    assert len(handed) == submitters * each
    for coro, future in handed:
        assert future.done(), "a future was left for ever"
        assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED
