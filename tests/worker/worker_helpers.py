"""Helpers for the worker tests: wait for a condition, run a worker in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import leaseq
from leaseq.worker import Worker, WorkerConfig


def wait_until(condition: Callable[[], Any], timeout_s: float = 15.0, what: str = "") -> Any:
    """Poll ``condition`` until it is truthy; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what or condition}")


@contextmanager
def running(app: leaseq.App, **config: Any) -> Iterator[Worker]:
    """A worker running in a thread for the duration of the block; stopped and joined after."""
    worker = Worker(app, WorkerConfig(**config))
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # surfaced in the test, not lost in the thread
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.request_stop()
        thread.join(timeout=30)
    assert not thread.is_alive(), "worker did not stop"
    assert not errors, errors


def events(queue: leaseq.Queue, job_id: str) -> list[str]:
    return [e.event for e in queue.journal(job_id)]
