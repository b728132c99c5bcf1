"""One heartbeat thread per worker: extends the leases of all in-flight jobs together.

It has its own thread so it keeps beating while handlers block, sleep or burn CPU (a busy
Python thread still lets others run every few milliseconds). Each beat is one
``Queue.heartbeat`` call per queue and lease length, i.e. one statement for all jobs of a queue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack

from leaseq.errors import LeaseqError
from leaseq.job import safe_reason
from leaseq.logfields import job_fields, queue_fields
from leaseq.redact import Redact, redact, traceback_text
from leaseq.runner import InFlight

log = logging.getLogger(__name__)

#: How soon to try again after the store refused a beat, as a share of the beat interval.
RETRY_SHARE = 0.25
#: Seconds between two calls of the ``on_tick`` hook (the worker registry's beat). Defaults
#: to 10 s: one small upsert per worker, whatever its concurrency or throughput.
TICK_EVERY_S = 10.0


class Heartbeat:
    def __init__(self, in_flight: Callable[[], list[InFlight]],
                 on_lost: Callable[[InFlight], None],
                 clock: Callable[[], float] = time.monotonic, redact: Redact = redact,
                 on_tick: Callable[[], None] | None = None, tick_every_s: float = TICK_EVERY_S):
        self.in_flight = in_flight
        self.on_tick = on_tick
        """Called from this thread every ``tick_every_s``, busy or idle (the worker registry
        beat); its errors are logged and never stop the leases' beat."""
        self.tick_every_s = tick_every_s
        self._next_tick_at: float | None = None
        self.redact = redact
        """Masks secrets in the errors this thread logs (the app's redactor)."""
        self.on_lost = on_lost
        self.clock = clock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="leaseq-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)

    def wake(self) -> None:
        """A job was added: its first beat may be due sooner than the current wait."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._tick()
            items = [i for i in self.in_flight() if _beaten(i)]
            due_at = min((i.next_beat_at for i in items), default=None)
            wait_s = 1.0 if due_at is None else due_at - self.clock()
            if wait_s > 0:
                self._wake.wait(wait_s)
                self._wake.clear()
                continue
            try:
                self.beat(items)
            except Exception as exc:  # never let the heartbeat die: every lease would lapse
                log.error("heartbeat failed; trying again\n%s", traceback_text(exc, self.redact),
                          extra=queue_fields("heartbeat_failed"))
                self._stop.wait(0.5)

    def _tick(self) -> None:
        now = self.clock()
        if self.on_tick is None or (self._next_tick_at is not None and now < self._next_tick_at):
            return
        self._next_tick_at = now + self.tick_every_s
        try:
            self.on_tick()
        except Exception as exc:  # the registry is for people; the leases come first
            log.warning("worker registry beat failed: %s", safe_reason(exc, redact=self.redact))

    def beat(self, items: list[InFlight]) -> None:
        """Extend every lease in ``items`` now; one store call per (queue, lease length).
        Leases the store reports lost are handed to ``on_lost``."""
        groups: dict[tuple[str, float], list[InFlight]] = {}
        for item in items:
            groups.setdefault((item.queue.name, item.lease_s), []).append(item)
        for group in groups.values():
            self._beat_group(group)

    def _beat_group(self, group: list[InFlight]) -> None:
        with ExitStack() as locks:
            # Hold each job's lock so that its finishing write waits for this beat; the other
            # order would report a job that just completed as a lost lease.
            for item in group:
                locks.enter_context(item.lock)
            live = [i for i in group if _beaten(i)]
            if not live:
                return
            queue, lease_s = live[0].queue, live[0].lease_s
            try:
                lost = set(queue.heartbeat([i.job for i in live], lease_s=lease_s))
            except LeaseqError as exc:
                log.warning("heartbeat for queue %s failed: %s", queue.name,
                            safe_reason(exc, redact=self.redact),
                            extra=queue_fields("heartbeat_failed", queue.name))
                for item in live:
                    item.next_beat_at = self.clock() + item.heartbeat_every_s * RETRY_SHARE
                return
            now = self.clock()
            for item in live:
                item.next_beat_at = now + item.heartbeat_every_s
                if item.job.id in lost:
                    log.warning("job %s: lease lost (attempt %d)", item.job.id,
                                item.job.attempts, extra=job_fields("lease_lost", item.job))
                    self.on_lost(item)


def _beaten(item: InFlight) -> bool:
    """Whether a beat extends this lease: not once its outcome is written or being written (a
    beat after the commit would see a finished job and call the lease lost)."""
    return not (item.finished or item.completing or item.job.lease_lost)
