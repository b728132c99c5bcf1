"""A deadline for every store call made inside a block, whatever the store.

``with within(1.0): queue.heartbeat(jobs)`` bounds the call, its reconnects and its retries to
one second; a store that cannot finish in time raises ``StoreUnavailable`` instead of waiting
(the PostgreSQL store cuts its connection, the MongoDB store hands the budget to pymongo's own
``timeout``). Deadlines nest: an inner block never extends an outer one. The deadline lives in
a context variable, so it follows the calling thread (and task) and nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_DEADLINE: ContextVar[float | None] = ContextVar("leaseq_deadline", default=None)


@contextmanager
def within(seconds: float) -> Iterator[float]:
    """Store calls in the block end within ``seconds`` (monotonic); yields the deadline."""
    at = time.monotonic() + max(seconds, 0.0)
    outer = _DEADLINE.get()
    if outer is not None:
        at = min(at, outer)
    token = _DEADLINE.set(at)
    try:
        yield at
    finally:
        _DEADLINE.reset(token)


def current() -> float | None:
    """The innermost deadline on the monotonic clock, or None outside any ``within`` block."""
    return _DEADLINE.get()


def remaining_s() -> float | None:
    """Seconds left before the current deadline (0 once passed), or None when there is none."""
    at = _DEADLINE.get()
    return None if at is None else max(at - time.monotonic(), 0.0)
