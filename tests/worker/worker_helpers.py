"""Helpers for the worker tests: wait for a condition, run a worker in a thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import leaseq
from leaseq.testing.harness import wait_until
from leaseq.worker import Worker, WorkerConfig

__all__ = ["events", "running", "wait_until"]


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
