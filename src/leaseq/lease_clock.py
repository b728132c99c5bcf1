"""The worker's local lease clock (DESIGN.md §8): a job whose lease no request confirmed in
time is abandoned before the store can give it to another worker, its slot freed at once, and
the abandonment journaled once the store answers again. ``LeaseClock`` is mixed into
``leaseq.worker.Worker``, whose state it uses; the broker consumer's executor
(``leaseq.delivery.execute``) abandons its jobs with the same ``abandon``, which logs them and
keeps their journal entries in an ``AbandonedJournal``."""

from __future__ import annotations

import enum
import logging
import threading
from collections import deque
from collections.abc import Callable

from leaseq.deadline import within
from leaseq.errors import LeaseqError
from leaseq.journal import JournalEvent
from leaseq.logfields import job_fields
from leaseq.runner import InFlight, Runner, holds_a_thread
from leaseq.stores.base import Store

log = logging.getLogger("leaseq.worker")  # the worker's records, whichever module writes them

#: Journal event of a job this worker stopped trusting its lease for (written when it can).
ABANDONED_EVENT = JournalEvent.LEASE_ABANDONED
#: How often a worker cut off from its store tries again to journal what it abandoned.
JOURNAL_RETRY_S = 1.0


class LeaseClock:
    """The lease clock's side of ``Worker``: abandon, free the slot, journal later."""

    store: Store
    worker_id: str
    clock: Callable[[], float]
    _runner: Runner
    _lock: threading.Lock
    _ready: deque[tuple[float, InFlight]]
    _running: int
    _abandoned_threads: int
    _abandoned: AbandonedJournal
    _settle: Callable[[InFlight], None]
    _start_ready: Callable[[], None]

    def _abandon(self, item: InFlight) -> bool:
        """The lease clock of ``item`` ran out (heartbeat thread): ``abandon`` it, then free its
        slot at once and let the next waiting job start. False when its finishing write holds
        it: that write is fenced, so the store decides, and the lease clock looks again
        shortly."""
        outcome = abandon(item, self._runner, self._abandoned, self.clock)
        self._let_go(item, outcome)
        return outcome is not Abandoning.BUSY

    def _lost(self, item: InFlight) -> None:
        """A beat found the lease of ``item`` gone (heartbeat thread): the job was cancelled,
        or another worker took it after its lease lapsed, and the store journaled
        ``heartbeat_lost``. It is let go as an abandoned job is, without a journal entry of
        its own: a waiting job never starts, an ``async def`` handler is cancelled, and the
        slot is free at once. When its finishing write holds it, that write is fenced and
        settles it; a handler starting just then sees ``job.lease_lost``."""
        outcome = forsake(item, self._runner)
        if outcome is Abandoning.BUSY:
            self._runner.lease_lost(item)
        self._let_go(item, outcome)

    def _let_go(self, item: InFlight, outcome: Abandoning) -> None:
        if outcome is Abandoning.ABANDONED:
            self._free_slot(item)
            self._settle(item)
            self._start_ready()

    def _free_slot(self, item: InFlight) -> None:
        """An abandoned job gives its slot back at once, whether its handler is waiting,
        running (a sync one runs on in its pool thread until it notices) or done."""
        with self._lock:
            for entry in self._ready:
                if entry[1] is item:
                    self._ready.remove(entry)  # never started: it holds no slot
                    return
            if item.future is not None and not item.landed:
                item.abandoned = True
                self._running -= 1
                if holds_a_thread(item):  # a sync handler keeps its pool thread (Worker._slots)
                    self._abandoned_threads += 1

    def _journal_abandoned(self) -> None:
        """Journal the jobs the lease clock abandoned, once the store answers again."""
        self._abandoned.write(self.store, self.worker_id)

    def abandoned_pending(self) -> int:
        """Abandoned jobs not yet journaled (the store has not answered since)."""
        return self._abandoned.pending()


class Abandoning(enum.Enum):
    """What ``abandon`` did with a job whose lease clock ran out."""

    BUSY = "busy"
    """Its finishing write holds it: that write is fenced, so the store decides; look again
    shortly."""
    SETTLED = "settled"
    """It was finished, or is being finished, already: nothing to abandon."""
    ABANDONED = "abandoned"
    """Abandoned now."""


def forsake(item: InFlight, runner: Runner) -> Abandoning:
    """Stop working for ``item``: the runner writes nothing for it any more, its handler sees
    ``job.lease_lost`` (an ``async def`` one is cancelled; a sync one runs on until it
    notices; one still waiting for a slot never starts). Never waits for the job's lock: a
    finishing write (or a handler's start) holding it makes this ``BUSY``."""
    if not item.lock.acquire(blocking=False):
        return Abandoning.BUSY
    try:
        if item.finished or item.completing:
            return Abandoning.SETTLED
        item.finished = True  # the runner writes nothing for it any more
        runner.lease_lost(item)
    finally:
        item.lock.release()
    if item.future is not None:
        item.future.cancel()
    return Abandoning.ABANDONED


def abandon(item: InFlight, runner: Runner, journal: AbandonedJournal,
            clock: Callable[[], float]) -> Abandoning:
    """Stop trusting the lease of ``item`` (the worker's and the broker consumer's lease
    clock): ``forsake`` it, log the warning, and keep its ``lease_abandoned`` entry in
    ``journal``."""
    outcome = forsake(item, runner)
    if outcome is Abandoning.ABANDONED:
        silent_s = clock() - item.confirmed_at
        log_abandoned(item, silent_s)
        journal.add(item, silent_s)
    return outcome


def log_abandoned(item: InFlight, silent_s: float) -> None:
    """The warning of a job whose lease clock ran out (event ``lease_abandoned``)."""
    log.warning("job %s: lease not confirmed for %.1f s; abandoned%s (attempt %d)",
                item.job.id, silent_s, "" if item.started else " before it started",
                item.job.attempts, extra=job_fields("lease_abandoned", item.job))


class AbandonedJournal:
    """Jobs the lease clock abandoned, to journal (``lease_abandoned``) once the store answers
    again: the abandonment usually means it did not. ``write`` tries at most every
    ``JOURNAL_RETRY_S`` while it does not. Thread-safe."""

    def __init__(self, clock: Callable[[], float]):
        self._clock = clock
        self._lock = threading.Lock()
        self._items: list[tuple[InFlight, float]] = []
        self._retry_at = 0.0

    def add(self, item: InFlight, silent_s: float) -> None:
        """``item`` was abandoned after ``silent_s`` without a confirmation."""
        with self._lock:
            self._items.append((item, silent_s))

    def pending(self) -> int:
        with self._lock:
            return len(self._items)

    def write(self, store: Store, worker_id: str | None = None) -> None:
        """Journal what is pending, in order, until the store fails (then wait before trying
        again). ``worker_id``: the writer to name; None names each job's claimer."""
        if not self._items:  # the common case, read without the lock: nothing to write
            return
        with self._lock:
            pending = list(self._items)
        if not pending or self._clock() < self._retry_at:
            return
        for item, silent_s in pending:
            job = item.job
            try:
                with within(JOURNAL_RETRY_S):
                    store.append_journal(
                        item.queue.name, job.id, ABANDONED_EVENT, attempt=job.attempts,
                        lease_epoch=job.lease_epoch, worker_id=worker_id or job.worker_id,
                        reason=f"lease not confirmed for {silent_s:.1f} s",
                        data={"silent_s": round(silent_s, 3)})
            except LeaseqError:
                self._retry_at = self._clock() + JOURNAL_RETRY_S
                return
            with self._lock:
                self._items.remove((item, silent_s))
