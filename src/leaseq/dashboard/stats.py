"""One shared stats snapshot per process, read again at most every ``max_age_s``, however
many tabs and event streams ask for it: the page cost does not grow with viewers. Counts are
bounded (``Store.queue_summary``): past ``COUNT_CAP`` they read "10,000+" (an estimate,
"≈ 201,000", on PostgreSQL). Held-back counts (``Store.held_back``) are read only for the
queues ``Store.limited_queues`` names."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from leaseq.journal import JournalEvent
from leaseq.stores.base import Store

#: The overview's "last hour": the hour up to now, not the clock hour now running.
LAST_HOUR_S = 3600.0


class StatsSnapshot:
    def __init__(self, store: Store, max_age_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.max_age_s = max_age_s
        self.clock = clock
        self.reads = 0
        self._lock = threading.Lock()
        self._value: list[dict[str, Any]] = []
        self._at: float | None = None

    def get(self) -> list[dict[str, Any]]:
        with self._lock:
            now = self.clock()
            if self._at is None or now - self._at >= self.max_age_s:
                self._value = self._read()
                self._at = now
                self.reads += 1
            return self._value

    def _read(self) -> list[dict[str, Any]]:
        # One read names the queues with limits: only those pay for ``held_back``.
        limited = self.store.limited_queues()
        return [self._row(queue, queue in limited) for queue in self.store.queues()]

    def _row(self, queue: str, limited: bool) -> dict[str, Any]:
        summary = self.store.queue_summary(queue)
        hour = self.store.journal_counts(queue, LAST_HOUR_S)
        held = self.store.held_back(queue) if limited else None
        return {
            "queue": queue,
            "counts": {status: str(count) for status, count in summary.counts.items()},
            "ready": str(summary.ready), "oldest_ready_s": round(summary.oldest_ready_s, 1),
            # None, not 0, for a queue without limits: the page shows "—" (nothing to hold).
            "held_by_key": None if held is None else held.by_key,
            "held_by_rate": None if held is None else held.by_rate,
            "done_last_hour": hour.get(JournalEvent.RESULT_SAVED, 0),
            "failed_last_hour": hour.get(JournalEvent.QUARANTINED, 0),
        }
