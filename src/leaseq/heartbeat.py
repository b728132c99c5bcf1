"""One heartbeat thread per worker: extends the leases of all in-flight jobs together.

It has its own thread so it keeps beating while handlers block, sleep or burn CPU (a busy
Python thread still lets others run every few milliseconds). Each beat is one
``Queue.heartbeat`` call per queue and lease length, i.e. one statement for all jobs of a queue.

It also keeps the local lease clock (DESIGN.md §8): a job's lease is trusted until the request
that last confirmed it was *sent*, plus the lease, minus a margin; past that the job is handed
to ``on_untrusted`` (the worker abandons it) even if no beat ever answered. A beat waits for the
store at most ``bound_s(interval)`` (never past the next lease-clock deadline) and holds no
job's lock longer than that: a black-holed network cannot stall the clock or the completions.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from leaseq.deadline import within
from leaseq.errors import LeaseqError
from leaseq.job import safe_reason
from leaseq.logfields import job_fields, queue_fields
from leaseq.redact import Redact, redact, traceback_text
from leaseq.runner import InFlight

log = logging.getLogger(__name__)

#: How soon to try again after the store refused a beat, as a share of the beat interval.
RETRY_SHARE = 0.25
#: A beat's default bound on the store call, as a share of the beat interval.
BOUND_SHARE = 0.5
#: Shortest bound a beat gets, however close the next lease-clock deadline.
MIN_BOUND_S = 0.05
#: How soon to look again at a job whose lease clock ran out while its finishing write held it.
BUSY_RETRY_S = 0.05


def _untrusted_never(item: InFlight) -> bool:
    return True  # only reached by a job some caller ``trust``ed
#: Seconds between two calls of the ``on_tick`` hook (the worker registry's beat). Defaults
#: to 10 s: one small upsert per worker, whatever its concurrency or throughput.
TICK_EVERY_S = 10.0
#: Longest the ``on_tick`` hook may wait for the store: it must not hold up the leases.
TICK_BOUND_S = 0.5


class Heartbeat:
    def __init__(self, in_flight: Callable[[], list[InFlight]],
                 on_lost: Callable[[InFlight], None],
                 clock: Callable[[], float] = time.monotonic, redact: Redact = redact,
                 on_tick: Callable[[], None] | None = None,
                 tick_every_s: float = TICK_EVERY_S, *,
                 on_untrusted: Callable[[InFlight], bool] = _untrusted_never,
                 margin_s: float = 1.0, timeout_s: float | None = None):
        self.in_flight = in_flight
        self.on_tick = on_tick
        """Called from this thread every ``tick_every_s``, busy or idle (the worker registry
        beat); its errors are logged and never stop the leases' beat."""
        self.tick_every_s = tick_every_s
        self._next_tick_at: float | None = None
        self.redact = redact
        """Masks secrets in the errors this thread logs (the app's redactor)."""
        self.on_lost = on_lost
        self.on_untrusted = on_untrusted
        """Told when a job's lease clock ran out; False when it could not act yet (the job's
        finishing write holds it): it is offered again shortly."""
        self.margin_s = margin_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.longest_call_s = 0.0
        """The longest store call a beat made so far (the chaos table reports it)."""
        self._slowed: set[tuple[float, float]] = set()
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

    def trust(self, item: InFlight, sent_at: float, lease_s: float) -> None:
        """A request sent at ``sent_at`` confirmed ``item``'s lease of ``lease_s``."""
        item.confirmed_at = sent_at
        item.trusted_until = sent_at + lease_s - self.margin(lease_s)

    def margin(self, lease_s: float) -> float:
        """How early the lease clock runs out: ``margin_s``, at most a third of the lease."""
        return min(self.margin_s, lease_s / 3)

    def every_s(self, every_s: float, lease_s: float) -> float:
        """How often a lease of ``lease_s`` is beaten: the policy's ``every_s``, but at least
        twice within what the lease clock trusts after a beat (``lease_s`` minus the margin):
        beaten more rarely, every job that outlives one interval would be abandoned while its
        lease still holds."""
        most = (lease_s - self.margin(lease_s)) / 2
        if every_s <= most:
            return every_s
        if (every_s, lease_s) not in self._slowed:
            self._slowed.add((every_s, lease_s))
            log.warning("heartbeat_every_s %.3g is too long for a lease of %.3g s with a "
                        "lease margin of %.3g s: beating every %.3g s instead", every_s,
                        lease_s, self.margin(lease_s), most, extra=queue_fields("heartbeat_every"))
        return most

    def bound_s(self, every_s: float) -> float:
        """Longest a beat of this interval waits for the store: ``timeout_s`` when set, never
        more than half the interval (a beat must end before the next is due)."""
        share = every_s * BOUND_SHARE
        return share if self.timeout_s is None else min(self.timeout_s, share)

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = self.clock()
            items = self.in_flight()
            busy = self._distrust(items, now)
            items = [i for i in items if _beaten(i)]
            self._tick(min((i.trusted_until for i in items), default=float("inf")))
            now = self.clock()
            due_at = min((i.next_beat_at for i in items), default=None)
            trust_at = min((i.trusted_until for i in items if i.trusted_until > now),
                           default=float("inf"))
            wait_s = min(1.0 if due_at is None else due_at - now, trust_at - now,
                         BUSY_RETRY_S if busy else float("inf"))
            if wait_s > 0:
                self._wake.wait(wait_s)
                self._wake.clear()
                continue
            if due_at is None or due_at > self.clock():
                continue  # woke for the lease clock, not for a beat
            try:
                self.beat(items)
            except Exception as exc:  # never let the heartbeat die: every lease would lapse
                log.error("heartbeat failed; trying again\n%s", traceback_text(exc, self.redact),
                          extra=queue_fields("heartbeat_failed"))
                self._stop.wait(0.5)

    def _distrust(self, items: list[InFlight], now: float) -> bool:
        """Hand every job whose lease clock ran out to ``on_untrusted``; True when one could
        not be taken yet."""
        busy = False
        for item in items:
            if _beaten(item) and item.trusted_until <= now:
                busy = not self._hand_untrusted(item) or busy
        return busy

    def _hand_untrusted(self, item: InFlight) -> bool:
        """``on_untrusted(item)``; False (offered again shortly) when it raised: this thread
        must outlive any one job's trouble, or every other lease would lapse with it."""
        try:
            return self.on_untrusted(item)
        except Exception as exc:
            log.error("job %s: abandoning it failed; trying again\n%s", item.job.id,
                      traceback_text(exc, self.redact),
                      extra=job_fields("abandon_failed", item.job))
            return False

    def _hand_lost(self, item: InFlight) -> None:
        """``on_lost(item)``, its error logged: the other jobs of the beat are still told."""
        try:
            self.on_lost(item)
        except Exception as exc:
            log.error("job %s: letting its lost lease go failed\n%s", item.job.id,
                      traceback_text(exc, self.redact), extra=job_fields("lease_lost", item.job))

    def _tick(self, trust_at: float = float("inf")) -> None:
        """Call ``on_tick`` when due, bounded so that it never holds up the next lease-clock
        deadline (``trust_at``) or the beats."""
        now = self.clock()
        if self.on_tick is None or (self._next_tick_at is not None and now < self._next_tick_at):
            return
        self._next_tick_at = now + self.tick_every_s
        try:
            with within(max(min(TICK_BOUND_S, trust_at - now), MIN_BOUND_S)):
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
        # Hold each job's lock so that its finishing write waits for this beat (the other
        # order would report a job that just completed as a lost lease). Never wait for one:
        # a job whose lock is taken is being finished (or started) and sits this beat out.
        held = [item for item in group if item.lock.acquire(blocking=False)]
        lost: list[InFlight] = []
        try:
            live = [i for i in held if _beaten(i)]
            for item in group:
                if item not in held:
                    item.next_beat_at = self.clock() + item.heartbeat_every_s * RETRY_SHARE
            if live:
                lost = self._extend(live)
        finally:
            for item in held:
                item.lock.release()
        for item in lost:  # once the locks are free: ``on_lost`` may take the job's own
            self._hand_lost(item)

    def _extend(self, live: list[InFlight]) -> list[InFlight]:
        """Beat ``live`` (their locks held); the items whose lease the store reports lost."""
        queue, lease_s = live[0].queue, live[0].lease_s
        sent_at = self.clock()
        bound = self.bound_s(min(i.heartbeat_every_s for i in live))
        until_clock = min(i.trusted_until for i in live) - sent_at
        try:
            with within(max(min(bound, until_clock), MIN_BOUND_S)):
                lost = set(queue.heartbeat([i.job for i in live], lease_s=lease_s))
        except LeaseqError as exc:
            log.warning("heartbeat for queue %s failed: %s", queue.name,
                        safe_reason(exc, redact=self.redact),
                        extra=queue_fields("heartbeat_failed", queue.name))
            for item in live:
                item.next_beat_at = self.clock() + item.heartbeat_every_s * RETRY_SHARE
            return []
        finally:
            self.longest_call_s = max(self.longest_call_s, self.clock() - sent_at)
        now = self.clock()
        for item in live:
            item.next_beat_at = now + item.heartbeat_every_s
            if item.job.id in lost:
                log.warning("job %s: lease lost (attempt %d)", item.job.id, item.job.attempts,
                            extra=job_fields("lease_lost", item.job))
            else:
                self.trust(item, sent_at, lease_s)
        return [item for item in live if item.job.id in lost]


def _beaten(item: InFlight) -> bool:
    """Whether a beat extends this lease: not once its outcome is written or being written (a
    beat after the commit would see a finished job and call the lease lost)."""
    return not (item.finished or item.completing or item.job.lease_lost)
