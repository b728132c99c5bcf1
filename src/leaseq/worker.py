"""The worker: claims its free slots and a bounded prefetch, runs handlers, keeps their leases,
drains on stop.

One main loop claims (one ``Queue.claim`` per queue, for the free slots plus what ``Prefetch``
allows), sync handlers run in a thread pool, ``async def`` handlers on one event loop in its own
thread, and one heartbeat thread extends every in-flight lease. Claimed jobs wait in ``_ready``
until a slot frees; the handler that frees a slot starts the next one itself. ``Runner`` turns
each outcome into one fenced write; plain completions go to the ``Completer``, which commits
them in batches on its own connection while the claims go on: a job stays in flight, under
its lease, until its batch committed. The heartbeat no longer beats it once it is handed to the
completer (a beat racing the commit would journal a lost lease for a finished job): a batch that
takes longer than the lease has left lets the job be claimed again, and its write is refused.

The local lease clock (DESIGN.md §8, in ``leaseq.lease_clock``): a job whose lease no request
confirmed in time is abandoned (``_abandon``) before the store can give it to another worker:
its handler sees ``job.lease_lost`` (an ``async def`` one is cancelled), its result will be
discarded, its slot is free at once, and the abandonment is journaled once the store answers
again. Start, drain and shutdown are in ``leaseq.lifecycle``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from leaseq import sweeper
from leaseq.app import App
from leaseq.completer import Completer
from leaseq.errors import InvalidInput, LeaseqError
from leaseq.heartbeat import Heartbeat
from leaseq.job import Job, safe_reason
from leaseq.lease_clock import ABANDONED_EVENT as ABANDONED_EVENT
from leaseq.lease_clock import JOURNAL_RETRY_S as JOURNAL_RETRY_S
from leaseq.lease_clock import AbandonedJournal, LeaseClock
from leaseq.lifecycle import PREFETCH_REASON, Lifecycle
from leaseq.lifecycle import SHUTDOWN_REASON as SHUTDOWN_REASON
from leaseq.lifecycle import nothing as _nothing
from leaseq.logfields import job_fields, queue_fields
from leaseq.metrics import Metrics
from leaseq.prefetch import FullKeys, Prefetch
from leaseq.queue import Queue
from leaseq.redact import redact_url, traceback_text
from leaseq.runner import COMPLETING, InFlight, LoopThread, Runner, holds_a_thread
from leaseq.signals import EXIT_SECOND_SIGNAL as EXIT_SECOND_SIGNAL
from leaseq.signals import DrainThenExit
from leaseq.validate import MAX_DELAY_S

log = logging.getLogger(__name__)

#: ``WorkerConfig`` durations that may be infinite: wait for every job at a stop; never sweep.
UNBOUNDED_OK = frozenset({"grace_s", "sweep_every_s"})


@dataclass(frozen=True)
class WorkerConfig:
    queues: tuple[str, ...] = ()
    """Queues to serve. Defaults to every queue the app's tasks use."""
    concurrency: int = 10
    """Jobs in flight at once (sync and async together). Defaults to 10."""
    burst: bool = False
    """Return once nothing is claimable and nothing is in flight. Defaults to False."""
    grace_s: float = 30.0
    """On stop, how long in-flight jobs may finish before they are given back. Defaults to 30 s."""
    sweep_every_s: float = 30.0
    """How often the worker runs the sweeper (reclaim, retention purge). Defaults to 30 s."""
    prefetch: int = 128
    """Most jobs claimed ahead of free slots, so one claim statement takes a big batch. A
    worker only claims ahead as many jobs as its handlers' pace starts within half of
    ``prefetch_wait_s`` even if they all finish at once (handlers that hold a slot longer:
    none), and never for a queue with a rate limit. 0 turns it off. Defaults to 128."""
    prefetch_wait_s: float = 0.5
    """How long a prefetched job may wait for a slot; one that waited longer is given back at
    once (free) for another worker to start. Defaults to 0.5 s."""
    claim_gather_s: float = 0.002
    """With jobs in flight and few slots free, how long to wait for more slots to free before
    claiming, so one claim takes several jobs. Defaults to 2 ms."""
    idle_min_s: float = 0.01
    """First wait when nothing was claimable; doubles while idle. Defaults to 10 ms."""
    idle_max_s: float = 1.0
    """Longest idle wait; an enqueue in this process (or a push wake-up) ends it at once.
    Defaults to 1 s."""
    metrics_port: int | None = None
    """Serve Prometheus metrics on this port. Defaults to None (not served)."""
    metrics_addr: str = "0.0.0.0"
    """Address the metrics server binds. Defaults to all interfaces."""
    retention_s: Mapping[str, float] = field(default_factory=dict)
    """Retention purge per terminal status for the sweeps (see ``SweeperConfig``). Defaults to
    keeping everything."""
    scheduler: bool = True
    """Run the app's schedules' scheduler in this worker (any number may: each tick is one job
    whatever the count). Defaults to True; ``leaseq worker --no-scheduler`` opts out."""
    lease_margin_s: float = 1.0
    """The local lease clock: a job whose lease was last confirmed by a request (claim or
    beat) sent at ``t`` is abandoned at ``t + lease_s - lease_margin_s`` unless a later beat
    confirmed it; the margin covers the clocks' drift and the request's trip, and is at most
    a third of the lease. Defaults to 1 s."""
    beat_timeout_s: float | None = None
    """Longest one heartbeat call waits for the store (its reconnects included); never more
    than half the beat interval, nor past the next lease-clock deadline. Defaults to None:
    half the interval."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "queues", tuple(self.queues))
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or not (
                1 <= self.concurrency <= 10_000):
            raise InvalidInput(f"concurrency must be 1 to 10000, got {self.concurrency!r}")
        if isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int) or not (
                0 <= self.prefetch <= 10_000):
            raise InvalidInput(f"prefetch must be 0 to 10000, got {self.prefetch!r}")
        for name in ("grace_s", "sweep_every_s", "claim_gather_s", "idle_min_s", "idle_max_s",
                     "prefetch_wait_s", "lease_margin_s"):
            value = getattr(self, name)
            # NaN compares false with everything: a NaN margin would keep the lease clock
            # from ever abandoning a job, a NaN grace would skip the grace period. Compared,
            # not converted: a huge int is no float (math.isnan(10**400) raises).
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or value != value or value < 0
                    or (value > MAX_DELAY_S and not (value == math.inf
                                                     and name in UNBOUNDED_OK))):
                raise InvalidInput(f"{name} must be a number of seconds from 0 to ten years"
                                   f"{', or inf' if name in UNBOUNDED_OK else ''}, got "
                                   f"{str(value)[:40]}")
        if not 0 < self.idle_min_s <= self.idle_max_s:
            raise InvalidInput("idle_min_s must be > 0 and at most idle_max_s")
        if self.sweep_every_s <= 0:
            raise InvalidInput("sweep_every_s must be > 0")
        timeout = self.beat_timeout_s
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(
                timeout, int | float) or not timeout > 0):
            raise InvalidInput(f"beat_timeout_s must be a number of seconds > 0, got {timeout!r}")
        self.sweeper_config()  # validates retention_s

    def sweeper_config(self) -> sweeper.SweeperConfig:
        return sweeper.SweeperConfig(every_s=self.sweep_every_s, retention_s=self.retention_s)


def make_worker_id() -> str:
    """``hostname:pid:uuid8``: unique per process start, and says where to look."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Worker(LeaseClock, Lifecycle):
    """Runs an ``App``'s tasks. ``run()`` blocks; ``request_stop()`` (any thread) or the
    ``stop_event`` given to ``run`` stops it gracefully; ``run(handle_signals=True)`` also
    stops on SIGTERM / SIGINT (main thread only)."""

    def __init__(self, app: App, config: WorkerConfig | None = None, *,
                 worker_id: str | None = None, metrics: Metrics | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.app = app
        self.config = config or WorkerConfig()
        self.worker_id = worker_id or make_worker_id()
        self.metrics = metrics or Metrics()
        self.clock = clock
        names = self.config.queues or tuple(app.queue_names())
        if not names:
            raise InvalidInput("nothing to work on: the app has no tasks and no queue was given")
        self.queues = [app.queue(name) for name in names]
        self.store = app.store
        self.metrics.watch_store(self.store, lambda: [q.name for q in self.queues],
                                 redact=app.redact)
        if app.schedules:  # the gauges read the ledger: served with or without the scheduler
            self.metrics.watch_schedules(self.store, app.redact)
        self._runner = Runner(app, self.metrics, sleep=sleep, clock=clock,
                              on_settled=self._settle)
        self._completer: Completer | None = None
        self._heartbeat = Heartbeat(self._snapshot, self._lost, clock, app.redact,
                                    on_tick=self._register,
                                    on_untrusted=self._abandon,
                                    margin_s=self.config.lease_margin_s,
                                    timeout_s=self.config.beat_timeout_s)
        self._abandoned = AbandonedJournal(clock)
        """Jobs abandoned by the lease clock, not yet journaled."""
        self._claim_lease_s = {q.name: self._lease_for_claim(q) for q in self.queues}
        self._lock = threading.Lock()
        self._in_flight: dict[tuple[str, str], InFlight] = {}
        """Every job under this worker's lease: waiting for a slot, running, or completing."""
        self._ready: deque[tuple[float, InFlight]] = deque()
        """Claimed jobs waiting for a slot, oldest first, with the time they must start by."""
        self._running = 0
        """Slots taken: handlers started or about to start (sync and async together)."""
        self._pool_tasks = 0
        """Handler runs handed to the pool and not ended yet (``has_stragglers``)."""
        self._abandoned_threads = 0
        """Pool threads still in a sync handler the lease clock abandoned (``_slots``)."""
        self._settled_first = 0
        """Settled jobs whose handler's run still holds a slot (``_slot_taken``)."""
        self._prefetch = Prefetch(self.config.prefetch, self.config.prefetch_wait_s,
                                  self.config.concurrency)
        self._stop = threading.Event()
        self._stop_event: threading.Event | None = None
        """The ``stop_event`` given to ``run``."""
        self._signals = DrainThenExit()  # counted by the handler, polled by the loop
        self._wake = threading.Event()
        self._rotation = 0
        self._full_keys = FullKeys(self.config.idle_min_s, self.config.idle_max_s)
        self._pool: ThreadPoolExecutor | None = None
        self._finisher: ThreadPoolExecutor | None = None
        self._loop = LoopThread(on_stop=self.store.aclose)
        self.started = threading.Event()
        """Set once ``run`` has started everything (metrics server, pools, heartbeat,
        scheduler) and works: what can fail at start-up has failed by then."""

    def __repr__(self) -> str:
        return f"<Worker {self.worker_id} queues={[q.name for q in self.queues]}>"

    # --- control -----------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming; in-flight jobs get ``grace_s`` to finish. Thread-safe."""
        self._stop.set()
        self._wake.set()
        for queue in self.queues:
            self.store.notify_local(queue.name)

    def stopping(self, stop_event: threading.Event | None = None) -> bool:
        return (self._stop.is_set() or self._signals.received > 0
                or (stop_event is not None and stop_event.is_set()))

    def in_flight(self) -> list[Job]:
        return [item.job for item in self._snapshot()]

    def has_stragglers(self) -> bool:
        """Whether a sync handler is still running in a pool thread: one given back at
        shutdown, or abandoned by the lease clock earlier (it has left the jobs in flight).
        A process that wants to exit now must then use ``os._exit``: a normal exit waits for
        every pool thread."""
        return self.stragglers() > 0

    def stragglers(self) -> int:
        """How many sync handlers still run in pool threads (``has_stragglers``): counted by
        their threads, not by ``in_flight``, which the abandoned ones have left."""
        with self._lock:
            return self._pool_tasks

    # --- the loop ----------------------------------------------------------------------------

    def run(self, stop_event: threading.Event | None = None, *,
            handle_signals: bool = False, same_stop_s: float = 0.0) -> None:
        """Work until stopped (or, with ``burst``, until there is nothing left).
        ``same_stop_s`` (with ``handle_signals``): a stop signal this soon after the first is
        the same stop, sent twice, not the second that ends the process at once
        (``leaseq.signals.DrainThenExit``)."""
        self._stop_event = stop_event
        restore = self._install_signals(same_stop_s) if handle_signals else _nothing
        try:
            stop_server = (self.metrics.serve(self.config.metrics_port, self.config.metrics_addr)
                           if self.config.metrics_port is not None else _nothing)
        except BaseException:  # the port is taken, say: the process's handlers go back
            restore()
            raise
        self._start()
        stop_scheduler = self._start_scheduler()
        log.info("worker %s serving %s at %s", self.worker_id,
                 ", ".join(q.name for q in self.queues), redact_url(self.store.url),
                 extra=queue_fields("worker_started"))
        self.started.set()
        try:
            self._work(stop_event)
        finally:
            try:
                self._drain()
            finally:
                stop_scheduler()
                self._shutdown()
                stop_server()
                restore()

    def _work(self, stop_event: threading.Event | None) -> None:
        idle_s = self.config.idle_min_s
        next_sweep = self.clock()
        while not self.stopping(stop_event):
            self._journal_abandoned()
            if self.clock() >= next_sweep:
                self.sweep()
                next_sweep = self.clock() + self.config.sweep_every_s
            self._give_back_overdue()
            self._gather_slots()
            # A job still in flight when the claim ran may hold what the claim lacked (a
            # key's slot): burst stops only after a claim that found the worker empty. Nor
            # while a slot is still taken with nothing in flight: a job whose outcome is
            # written holds its slot until its handler's run ends, a moment later, and a
            # claim skipped for want of room found nothing.
            was_busy = bool(self._snapshot())
            asked = self._wants_claim()
            if asked and self._claim_round():
                idle_s = self.config.idle_min_s
                continue
            if (self.config.burst and not was_busy and not self._snapshot()
                    and (asked or not self._slot_taken())):
                log.info("burst: nothing claimable and nothing in flight; stopping",
                         extra=queue_fields("burst_done"))
                return
            self._idle(min(idle_s, max(next_sweep - self.clock(), 0.0)))
            idle_s = min(idle_s * 2, self.config.idle_max_s)

    def _gather_slots(self) -> None:
        """While jobs run, let slots that free close together be claimed together: one claim
        statement for several jobs instead of one each. Waits at most ``claim_gather_s``."""
        want = max(1, self.config.concurrency // 4)
        deadline = self.clock() + self.config.claim_gather_s
        while 0 < self._room() < want and self.clock() < deadline and self._snapshot():
            self._wake.wait(self.config.claim_gather_s / 4)
            self._wake.clear()

    def _wants_claim(self) -> bool:
        """Claim when there is room, and no more than half the prefetch is still waiting (the
        jobs already claimed keep the slots busy meanwhile, so the claim's batch grows)."""
        with self._lock:
            waiting = len(self._ready)
        return self._room() > 0 and waiting <= self._prefetch.allowance() // 2

    def _idle(self, timeout_s: float) -> None:
        timeout_s = min(timeout_s, self._until_overdue(),
                        self._full_keys.until_recheck(self.clock(), self._finishing))
        if self._room() > 0 and not (self.config.burst and self._snapshot()):
            # Woken at once by an enqueue in this process, or a push wake-up (NOTIFY).
            self.store.wait_for_work([q.name for q in self.queues], timeout_s)
        else:
            self._wake.wait(timeout_s)  # a finished job frees a slot
            self._wake.clear()

    def _claim_round(self) -> int:
        """Claim up to the room (free slots plus prefetch), one claim call per queue, starting
        with a different queue each round so that one busy queue cannot starve the others."""
        order = self.queues[self._rotation:] + self.queues[:self._rotation]
        self._rotation = (self._rotation + 1) % len(self.queues)
        claimed = 0
        for queue in order:
            room = self._room(prefetch=_may_prefetch(queue))
            if room <= 0 or self._full_keys.left_out(
                    queue.name, self.clock(), functools.partial(self._holds, queue),
                    functools.partial(self._finishing, queue.name)):
                continue
            mark = self._full_keys.before_claim(queue.name)
            sent_at = self.clock()  # the lease clock of these jobs starts when the claim left
            try:
                jobs = queue.claim(self.worker_id, room, lease_s=self._claim_lease_s[queue.name])
            except LeaseqError as exc:
                log.warning("claim from queue %s failed: %s", queue.name, self._why(exc),
                            extra=queue_fields("claim_failed", queue.name))
                continue
            self._full_keys.after_claim(queue.name, mark, sent_at,
                                        short=len(jobs) < room and _key_limited(queue))
            for job in jobs:
                self._track(queue, job, sent_at)
            if jobs:
                self._heartbeat.wake()  # their first beats may be due before its next one
            self._start_ready()
            claimed += len(jobs)
        return claimed

    def sweep(self) -> list[sweeper.SweepResult]:
        """Run the sweeper once (the loop does every ``sweep_every_s``); failures are logged.
        It reclaims expired leases in every queue of the store, and purges by ``retention_s``
        only the queues this worker serves. The queues swept are counted and returned even
        when another's sweep failed."""
        results: list[sweeper.SweepResult] = []

        def swept(result: sweeper.SweepResult) -> None:
            results.append(result)
            self.metrics.reclaimed(result.queue, result.reclaimed + result.expired)

        try:
            sweeper.run_once(self.store, self.config.sweeper_config(),
                             purge={q.name for q in self.queues}, on_queue=swept)
        except LeaseqError as exc:
            log.warning("sweep failed: %s", self._why(exc), extra=queue_fields("sweep_failed"))
        return results

    # --- jobs --------------------------------------------------------------------------------

    def _lease_for_claim(self, queue: Queue) -> float:
        """The lease a claim takes: the tasks' own when all tasks of the queue agree, else the
        queue's (the first beat, due within a third of it, then sets each task's lease)."""
        leases = {t.policy.lease_s for t in self.app.tasks.values() if t.queue == queue.name}
        return leases.pop() if len(leases) == 1 else queue.policy.lease_s

    def _track(self, queue: Queue, job: Job, sent_at: float) -> None:
        """A claimed job: under lease from now on, waiting in ``_ready`` for a slot; its lease
        clock runs from ``sent_at``, when the claim was sent."""
        task = self.app.get_task(job.task)
        policy = self.app.job_policy(job)
        # QueuePolicy fills heartbeat_every_s in (lease_s / 3) when built without one
        every_s = self._heartbeat.every_s(policy.heartbeat_every_s,  # type: ignore[arg-type]
                                          policy.lease_s)
        now = self.clock()
        first_beat_s = min(every_s, self._claim_lease_s[queue.name] / 3)
        item = InFlight(job, task, queue, policy.lease_s, every_s, now + first_beat_s)
        self._heartbeat.trust(item, sent_at, self._claim_lease_s[queue.name])
        if item.trusted_until <= now:
            # The claim's answer came back after its lease clock ran out (a slow or cut-off
            # network): another worker may hold the job soon, so it never starts here.
            self._abandon(item)
            return
        with self._lock:
            earlier = self._in_flight.get((queue.name, job.id))
            self._in_flight[(queue.name, job.id)] = item
            self._ready.append((now + self.config.prefetch_wait_s, item))
        if earlier is not None:
            # Claimed again while this worker still runs it: the earlier lease lapsed, or the
            # job was deleted and enqueued again. The store refuses the earlier claim's writes
            # (its epoch or its claim token is not the record's); its handler is told to stop.
            self._runner.lease_lost(earlier)

    def _start_ready(self) -> None:
        """Start waiting jobs while slots are free (called by the loop after a claim, and by
        each handler that frees its slot, so a slot never waits for the loop)."""
        while (item := self._take_ready()) is not None:
            self._launch(item)

    def _take_ready(self) -> InFlight | None:
        """The oldest waiting job, its slot taken; None when none waits, no slot is free, or
        the worker is stopping (a stop signal, or ``run``'s ``stop_event``, reach the loop
        only when it next looks: a job started meanwhile would not go back free)."""
        with self._lock:
            if (self.stopping(self._stop_event) or not self._ready
                    or self._running >= self._slots()):
                return None
            _, item = self._ready.popleft()
            self._running += 1
            item.slotted = True
        return item

    def _give_back_overdue(self) -> None:
        """Prefetched jobs that waited longer than ``prefetch_wait_s`` go back at once, free,
        for a worker with a free slot to start; and this worker stops claiming ahead until its
        handlers finish jobs again."""
        now = self.clock()
        overdue: list[InFlight] = []
        with self._lock:
            while self._ready and self._ready[0][0] <= now:
                overdue.append(self._ready.popleft()[1])
        if overdue:
            self._prefetch.reset()
            for item in overdue:
                self._give_back(item, PREFETCH_REASON)
                self._settle(item)

    def _until_overdue(self) -> float:
        with self._lock:
            return max(self._ready[0][0] - self.clock(), 0.0) if self._ready else float("inf")

    def _launch(self, item: InFlight) -> None:
        item.slot_taken_at = self.clock()
        if not holds_a_thread(item):
            coro = self._runner.run_async(item, self._finish_off_loop)
            future = self._loop.submit(coro)
            item.future = future
            future.add_done_callback(functools.partial(self._landed, item))
        else:
            item.future = Future()
            assert self._pool is not None  # made by _start, before the first claim
            with self._lock:
                self._pool_tasks += 1
            self._pool.submit(self._run_slot, item).add_done_callback(self._pool_task_ended)

    def _pool_task_ended(self, _: Future[None]) -> None:
        with self._lock:
            self._pool_tasks -= 1

    def _slots(self) -> int:
        """How many jobs may hold a slot now (under ``_lock``): ``concurrency``, less the pool
        threads that sync handlers abandoned by the lease clock still hold beyond the pool's
        spare half. Those handlers freed their slots but not their threads; without this, a
        job started in such a slot would wait in the pool's queue, under lease and heartbeat,
        for as long as they run."""
        concurrency = self.config.concurrency
        return min(concurrency, 2 * concurrency - self._abandoned_threads)

    def _run_slot(self, item: InFlight | None) -> None:
        """A pool thread's turn with one slot: run the sync handler, land it, and go on with the
        next waiting job itself while there is one (no hand-over to another thread per job)."""
        while item is not None:
            future = item.future
            assert future is not None
            if future.set_running_or_notify_cancel():  # not given back before it started
                try:
                    future.set_result(self._runner.run_sync(item))
                except BaseException as exc:  # landed as a worker error, as the pool would
                    future.set_exception(exc)
            self._landed(item, future, start_next=False)
            item = self._take_ready()
            if item is not None:
                item.slot_taken_at = self.clock()
                if not holds_a_thread(item):
                    self._launch(item)  # an async handler runs on the loop, not here
                    item = None
                else:
                    item.future = Future()
        self._start_ready()

    def _finish_off_loop(self, fn: Callable[..., str], *args: Any) -> asyncio.Future[str]:
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._finisher, fn, *args)

    def _landed(self, item: InFlight, future: Future[Any], start_next: bool = True) -> None:
        """The handler is done with its slot. The job stays in flight while the completer
        writes it (``COMPLETING``); any other outcome is written already. ``start_next``:
        start waiting jobs here (a pool thread's slot loop takes the next one itself)."""
        with self._lock:
            item.landed = True
            if item.settled_first:
                self._settled_first -= 1
            if not item.abandoned:  # an abandoned job's slot was freed already
                self._running -= 1
            elif holds_a_thread(item):
                self._abandoned_threads -= 1  # ...but not its thread, until now
        self._prefetch.finished(self.clock() - item.slot_taken_at)
        if future.cancelled():
            # by a give-back, or by the stop of the handlers' loop: then it goes back now
            self._give_back(item, SHUTDOWN_REASON)
        error = None if future.cancelled() else future.exception()
        if future.cancelled() or error is not None or future.result() != COMPLETING:
            if error is not None:
                log.error("job %s: worker error\n%s", item.job.id,
                          traceback_text(error, self.app.redact),
                          extra=job_fields("worker_error", item.job))
            self._settle(item)
        if start_next:
            self._start_ready()
        self._wake_loop(item)

    def _settle(self, item: InFlight) -> None:
        """The job's outcome is written (or given up): it leaves this worker's lease."""
        with self._lock:
            key = (item.queue.name, item.job.id)
            # Only this attempt's entry: after a lapsed lease this worker may hold the same
            # job again under a newer epoch, and that attempt must stay tracked.
            if self._in_flight.get(key) is item:
                del self._in_flight[key]
            if item.slotted and not item.landed and not item.abandoned:
                item.settled_first = True
                self._settled_first += 1
            self._full_keys.settled(item.queue.name)
        self._wake_loop(item)

    def _wake_loop(self, item: InFlight) -> None:
        """Room again: wake the loop to claim, unless more than half the prefetch limit still
        waits for a slot (``_wants_claim`` would not claim then). Waking it for every job
        would cost more than the claims it saves."""
        with self._lock:
            waiting = len(self._ready)
        if waiting <= self._prefetch.limit // 2:
            self._wake.set()
            self.store.notify_local(item.queue.name)

    def _holds(self, queue: Queue) -> bool:
        """Whether any job of ``queue`` is in this worker's lease."""
        with self._lock:
            return any(name == queue.name for name, _ in self._in_flight)

    def _finishing(self, queue: str) -> bool:
        """Whether a job of ``queue`` that this worker ran is being finished: its handler
        returned and its completion is being written (it settles once that commits)."""
        with self._lock:
            return any(item.landed for (name, _), item in self._in_flight.items()
                       if name == queue)

    # --- helpers ---------------------------------------------------------------------------

    def _why(self, error: BaseException) -> str:
        """An error as a log line shows it: type and message, with the app's redactor."""
        return safe_reason(error, redact=self.app.redact)

    def _snapshot(self) -> list[InFlight]:
        with self._lock:
            return list(self._in_flight.values())

    def _slot_taken(self) -> bool:
        """Whether a job whose outcome is written still holds its slot (its handler's run is
        not over yet). Not a handler that runs on without a lease: that one may never end."""
        with self._lock:
            return self._settled_first > 0

    def _room(self, prefetch: bool = True) -> int:
        """Jobs the next claim may take: the free slots, plus the prefetch allowance, minus
        the jobs already waiting; and never more leases than twice slots plus prefetch (jobs
        whose completion is still being written hold theirs)."""
        allowance = self._prefetch.allowance() if prefetch else 0
        concurrency = self.config.concurrency
        with self._lock:
            room = self._slots() + allowance - self._running - len(self._ready)
            leases = 2 * (concurrency + self._prefetch.limit) - len(self._in_flight)
        return min(room, leases)


def _key_limited(queue: Queue) -> bool:
    return bool(getattr(queue.policy, "key_limit", None))


def _may_prefetch(queue: Queue) -> bool:
    """Whether the claim may take more than the free slots: not for a queue with a rate limit
    (DESIGN §8's ``rate_per_s``), where a prefetched job would have spent its place in the
    window while it waits, so that handlers could start in bursts the window was meant to
    spread. A key-limited queue may: its claim counts a prefetched job in its key's running
    jobs (it is ``processing``), so no more than ``key_limit`` of a key run at once or wait
    to, and one that cannot start within ``prefetch_wait_s`` goes back with its slot."""
    return not getattr(queue.policy, "rate_per_s", None)
