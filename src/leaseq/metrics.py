"""Prometheus metrics: counters the worker records as outcomes happen, gauges read from the store.

Each ``Metrics`` owns its own ``CollectorRegistry`` (no module-level state), so two workers in
one process, or a test, never share counters. The worker's outcome handler is the one place that
records counters; stores know nothing about metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from leaseq import deadline
from leaseq.browse import SUMMARY_STATUSES
from leaseq.errors import InvalidInput, LeaseqError
from leaseq.job import safe_reason
from leaseq.limits import HeldBack
from leaseq.redact import Redact, redact
from leaseq.stores.base import Store

if TYPE_CHECKING:
    from leaseq.ledger import ScheduleState

log = logging.getLogger(__name__)
T = TypeVar("T")

DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
#: Store gauges read longer ago than this many refreshes (and at least ``STALE_MIN_S``) are no
#: longer served: an autoscaler must not go on scaling on counts the store no longer confirms.
STALE_AFTER_REFRESHES = 3
STALE_MIN_S = 15.0
#: How long one scrape's read of the store gauges, and of the schedule ledger, may wait: a store
#: that does not answer reads as ``leaseq_store_up 0`` within Prometheus's default scrape
#: timeout (10 s), rather than as a failed scrape (a PostgreSQL read otherwise retries for its
#: ``reconnect_s``, 15 s, and a scrape made two such reads).
STORE_READ_S = 4.0


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    queue: str
    counts: dict[str, int]
    ready: int
    oldest_pending_age_s: float
    in_flight: int = 0
    """Processing jobs under a live lease: work that an autoscaler must not scale away."""
    held_back: HeldBack = field(default_factory=HeldBack)
    """Ready jobs the queue's claim limits keep from being claimed now (docs/limits.md)."""

    @property
    def runnable(self) -> int:
        """Ready jobs no limit holds back: the ready work a new worker could start."""
        return max(self.ready - self.held_back.total, 0)


@dataclass(frozen=True, slots=True)
class MetricsServer:
    """A running ``/metrics`` endpoint: the port it listens on (the one the system gave, for
    port 0); called, it stops."""

    port: int
    stop: Callable[[], None]

    def __call__(self) -> None:
        self.stop()


def snapshot(store: Store, queues: Sequence[str] | None = None) -> list[QueueSnapshot]:
    """Counts by status, ready, oldest pending age, in-flight and held-back jobs per queue
    (all queues when None). Held back: by the limits the queue's claims last ran with."""
    names = list(queues) if queues else store.queues()
    limited = store.limited_queues()  # one read: only these queues pay for ``held_back``
    return [QueueSnapshot(q, store.counts(q), *store.ready_stats(q), store.in_flight(q),
                          store.held_back(q) if q in limited else HeldBack()) for q in names]


class CachedRead(Generic[T]):
    """A collector's read of the store, the one home of the rule every collector serves by:
    read at most once per ``refresh_s`` — a read that failed too, so that scrapes during an
    outage answer at once instead of each waiting out the store — and the last value served
    until ``stale_after_s`` old, then none. ``up``: whether the last read succeeded.

    Any exception of the read is a failed read, not only a ``LeaseqError``: a driver's own
    (psycopg's UndefinedTable before a migration) raised from ``collect`` would fail every
    scrape, the counters with it. It is logged by its type and masked text (``safe_reason``
    with ``redact``), never with its traceback, whose frames may show a connection's secret.
    """

    def __init__(self, read: Callable[[], T], what: str, refresh_s: float,
                 clock: Callable[[], float], redact: Redact):
        self.read = read
        self.what = what
        self.refresh_s = refresh_s
        self.clock = clock
        self.redact = redact
        self.stale_after_s = max(STALE_AFTER_REFRESHES * refresh_s, STALE_MIN_S)
        self.up = False
        self._lock = threading.Lock()
        self._last: tuple[T, float] | None = None
        self._tried_at: float | None = None

    def get(self) -> tuple[T, float] | None:
        """The last value read and its age in seconds (read again first once ``refresh_s``
        has passed since the last try); None when none was read or it is stale."""
        with self._lock:
            now = self.clock()
            if self._tried_at is None or now - self._tried_at >= self.refresh_s:
                self._refresh(now)
            if self._last is None or now - self._last[1] > self.stale_after_s:
                return None
            return self._last[0], now - self._last[1]

    def _refresh(self, now: float) -> None:
        self._tried_at = now
        try:
            with deadline.within(STORE_READ_S):
                self._last = (self.read(), now)
            self.up = True
        except Exception as exc:  # any: see the class's docstring
            self.up = False
            log.warning("metrics: cannot read %s: %s", self.what,
                        safe_reason(exc, redact=self.redact))


class StoreCollector(Collector):
    """Gauges read from the store when scraped, cached for ``refresh_s`` so that frequent
    scrapes (or several Prometheus servers) cost one round of queries. When the store cannot
    be read, the last counts are served until they are ``stale_after_s`` old, then none;
    ``leaseq_store_up`` says whether the last read succeeded (``CachedRead``). ``redact``
    masks the store errors it logs."""

    def __init__(self, store: Store, queues: Callable[[], Sequence[str] | None],
                 refresh_s: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 redact: Redact = redact):
        self.store = store
        self.queues = queues
        self._read = CachedRead(lambda: snapshot(store, queues()),
                                "queue gauges from the store", refresh_s, clock, redact)
        self.stale_after_s = self._read.stale_after_s

    def _snapshots(self) -> list[QueueSnapshot]:
        last = self._read.get()
        return last[0] if last else []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily("leaseq_jobs", "Jobs by queue and status.",
                                 labels=["queue", "status"])
        ready = GaugeMetricFamily("leaseq_ready_jobs",
                                  "Jobs claimable now: the number to scale workers on.",
                                  labels=["queue"])
        oldest = GaugeMetricFamily("leaseq_oldest_pending_age_seconds",
                                   "Seconds the longest-waiting claimable job has waited.",
                                   labels=["queue"])
        in_flight = GaugeMetricFamily(
            "leaseq_in_flight_jobs",
            "Jobs being worked on now (processing, lease live): scale on ready + in flight, so "
            "running work is never scaled away.", labels=["queue"])
        held = GaugeMetricFamily(
            "leaseq_held_back_jobs",
            "Ready jobs a claim limit keeps waiting now, by limit (key, rate): ready but not "
            "running, and more workers would not start them.", labels=["queue", "limit"])
        runnable = GaugeMetricFamily(
            "leaseq_runnable_jobs",
            "Ready jobs no claim limit holds back: with leaseq_in_flight_jobs, the number to "
            "scale workers on.", labels=["queue"])
        snapshots = self._snapshots()
        up = GaugeMetricFamily("leaseq_store_up", "1 when the last read of the store gauges "
                               "succeeded, else 0 (they go once that read is stale).",
                               value=int(self._read.up))
        for snap in snapshots:
            # leaseq's statuses always (a count that falls to 0 reads 0, not a gap); an app's
            # own terminal statuses while it has jobs in them.
            for status in sorted({*SUMMARY_STATUSES, *snap.counts}):
                jobs.add_metric([snap.queue, status], snap.counts.get(status, 0))
            ready.add_metric([snap.queue], snap.ready)
            oldest.add_metric([snap.queue], snap.oldest_pending_age_s)
            in_flight.add_metric([snap.queue], snap.in_flight)
            held.add_metric([snap.queue, "key"], snap.held_back.by_key)
            held.add_metric([snap.queue, "rate"], snap.held_back.by_rate)
            runnable.add_metric([snap.queue], snap.runnable)
        yield from (up, jobs, ready, oldest, in_flight, held, runnable)


class ScheduleCollector(Collector):
    """Per schedule, from the ledger when scraped: the last tick enqueued, and how late the
    oldest due tick not yet decided is (0 when none is due: the scheduler is keeping up; and
    for a paused or inactive schedule, which no tick is due of). An inactive schedule's
    series stays, at 0, rather than vanishing: a series that disappears reads to an
    ``absent()`` alert as a scheduler gone, and to a graph as a gap. The ledger is read at
    most once per ``refresh_s``, as the store gauges are (``CachedRead``); between reads the
    lag grows by the time passed. ``leaseq_schedules_up`` says whether the last read
    succeeded: a process that serves only these gauges (``leaseq scheduler --metrics-port``)
    has no ``leaseq_store_up`` to alert on. ``redact`` masks the store errors it logs."""

    def __init__(self, store: Store, redact: Redact = redact, refresh_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.store = store
        self._read = CachedRead(self._ledger, "the schedule ledger", refresh_s, clock, redact)

    def _ledger(self) -> tuple[list[ScheduleState], datetime | None]:
        states = self.store.schedules()
        # the store's clock is read only when there is a schedule to measure
        return states, self.store.server_now() if states else None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        last = GaugeMetricFamily("leaseq_schedule_last_tick_timestamp",
                                 "Unix time of the schedule's last tick enqueued.",
                                 labels=["schedule"])
        lag = GaugeMetricFamily("leaseq_schedule_lag_seconds",
                                "Seconds since the oldest due tick not yet enqueued (or "
                                "decided); 0 when the scheduler keeps up, or it is paused or "
                                "inactive.",
                                labels=["schedule"])
        read = self._read.get()
        if read is not None:
            (states, read_now), age_s = read
            if read_now is not None:  # None: no schedule in the ledger
                self._measure(states, read_now + timedelta(seconds=age_s), last, lag)
        up = GaugeMetricFamily("leaseq_schedules_up", "1 when the last read of the schedule "
                               "ledger succeeded, else 0 (the schedule gauges go once that "
                               "read is stale).", value=int(self._read.up))
        yield from (up, last, lag)

    @staticmethod
    def _measure(states: list[ScheduleState], now: datetime, last: GaugeMetricFamily,
                 lag: GaugeMetricFamily) -> None:
        from leaseq.scheduler.spec import Schedule

        for state in states:
            if state.last_tick is not None:
                last.add_metric([state.name], state.last_tick.timestamp())
            try:
                due = Schedule.from_ledger(state.name, state.queue, state.spec_json).next_after(
                    state.cursor)
            except LeaseqError:  # a spec this process cannot read (another version's zone)
                continue
            late = (now - due).total_seconds() if state.ticking else 0.0
            lag.add_metric([state.name], max(late, 0.0))


class Metrics:
    """The counters a worker records, and (optionally) the store gauges, in one registry."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.processed = Counter("leaseq_processed", "Handler runs by outcome.",
                                 ["queue", "outcome"], registry=self.registry)
        self.reclaimed_jobs = Counter("leaseq_reclaimed", "Expired leases reclaimed by a sweep.",
                                      ["queue"], registry=self.registry)
        self.lease_lost_jobs = Counter("leaseq_lease_lost",
                                       "In-flight jobs whose lease was taken from this worker.",
                                       ["queue"], registry=self.registry)
        self.duration = Histogram("leaseq_job_duration_seconds", "Handler run time.", ["queue"],
                                  buckets=DURATION_BUCKETS_S, registry=self.registry)

    def watch_store(self, store: Store, queues: Callable[[], Sequence[str] | None],
                    refresh_s: float = 5.0, redact: Redact = redact) -> None:
        """Add the ``leaseq_jobs`` / ``leaseq_ready_jobs`` / oldest-age /
        ``leaseq_in_flight_jobs`` / ``leaseq_held_back_jobs`` / ``leaseq_runnable_jobs``
        gauges; ``redact`` (the app's, where there is one) masks the errors logged when the
        store cannot be read."""
        self.registry.register(StoreCollector(store, queues, refresh_s, redact=redact))

    def watch_schedules(self, store: Store, redact: Redact = redact,
                        refresh_s: float = 5.0) -> None:
        """Add the ``leaseq_schedule_last_tick_timestamp`` / ``leaseq_schedule_lag_seconds``
        gauges, the ledger read at most once per ``refresh_s``; ``redact`` as for
        ``watch_store``."""
        self.registry.register(ScheduleCollector(store, redact, refresh_s))

    def job_finished(self, queue: str, outcome: str, duration_s: float | None) -> None:
        self.processed.labels(queue, outcome).inc()
        if duration_s is not None:
            self.duration.labels(queue).observe(duration_s)

    def lease_lost(self, queue: str) -> None:
        self.lease_lost_jobs.labels(queue).inc()

    def reclaimed(self, queue: str, n: int) -> None:
        if n:
            self.reclaimed_jobs.labels(queue).inc(n)

    def serve(self, port: int, addr: str = "0.0.0.0") -> MetricsServer:
        """Expose ``/metrics`` on ``port`` (0: a free one) from a daemon thread; returns the
        server, which stops when called. ``InvalidInput`` when it cannot listen there (the
        port is taken, the address unknown)."""
        try:
            server, thread = start_http_server(port, addr, registry=self.registry)
        except (OSError, OverflowError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise InvalidInput(f"cannot serve metrics on {addr}:{port}: {reason}") from None

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)

        return MetricsServer(int(server.server_port), stop)
