"""The worker's start, drain and shutdown: its pools and the scheduler thread, the grace
period and the give-back of what is left, the worker registry's beat, and the stop signals
(their handler lives in ``leaseq.signals``). Mixed into ``leaseq.worker.Worker``, whose state
it uses."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from leaseq.app import App
from leaseq.completer import Completer
from leaseq.deadline import within
from leaseq.errors import LeaseqError
from leaseq.heartbeat import Heartbeat
from leaseq.job import LeaseLost
from leaseq.logfields import job_fields, queue_fields
from leaseq.queue import Queue
from leaseq.runner import InFlight, LoopThread, Runner, in_new_thread
from leaseq.signals import DrainThenExit
from leaseq.stores.base import Store

if TYPE_CHECKING:
    from leaseq.worker import WorkerConfig

log = logging.getLogger("leaseq.worker")  # the worker's records, whichever module writes them

#: Longest the give-backs of one stop may wait for the store, all together: a store that does
#: not answer must not hold the stop up for a reconnect per job (the jobs it could not take
#: come back when their leases expire).
GIVE_BACK_BOUND_S = 10.0
SHUTDOWN_REASON = "worker shutting down: given back to be taken at once"
PREFETCH_REASON = "prefetched but not started in time: given back to be taken at once"
#: A prefetched job a stop found still waiting for its slot: the stop's word, not a slow slot's.
NOT_STARTED_REASON = ("worker shutting down before it started: given back to be taken at "
                      "once")


class Lifecycle:
    """Start, drain and shut down ``Worker``."""

    app: App
    config: WorkerConfig
    store: Store
    worker_id: str
    queues: list[Queue]
    clock: Callable[[], float]
    _runner: Runner
    _completer: Completer | None
    _heartbeat: Heartbeat
    _lock: threading.Lock
    _ready: deque[tuple[float, InFlight]]
    _wake: threading.Event
    _signals: DrainThenExit
    _pool: ThreadPoolExecutor | None
    _finisher: ThreadPoolExecutor | None
    _loop: LoopThread
    _settle: Callable[[InFlight], None]
    _snapshot: Callable[[], list[InFlight]]
    _why: Callable[[BaseException], str]

    def _start(self) -> None:
        # Twice the slots: a sync handler abandoned by the lease clock keeps its thread until
        # it notices, while its slot already runs the next job (threads start only if needed).
        self._pool = ThreadPoolExecutor(2 * self.config.concurrency,
                                        thread_name_prefix="leaseq-job")
        self._finisher = ThreadPoolExecutor(2, thread_name_prefix="leaseq-finish")
        self._completer = self._runner.completer = Completer()
        self._runner.fallback = self._write_again
        self._heartbeat.start()

    def _write_again(self, write: Callable[[], None]) -> None:
        """A write the completer could not make, tried again off its thread: on the finisher,
        or on a thread of its own once the finisher is shut down (a handler that outlived
        the worker)."""
        try:
            assert self._finisher is not None  # made with the completer, in _start
            self._finisher.submit(write)
        except RuntimeError:  # "cannot schedule new futures after shutdown"
            in_new_thread(write)

    def _start_scheduler(self) -> Callable[[], None]:
        """The scheduler in a thread of its own when the app has schedules; returns its stop."""
        if not self.config.scheduler or not self.app.schedules:
            return nothing
        from leaseq.scheduler.service import Scheduler

        stop = threading.Event()
        thread = threading.Thread(target=Scheduler(self.app).run, args=(stop,),
                                  name="leaseq-scheduler", daemon=True)
        thread.start()

        def stop_it() -> None:
            stop.set()
            thread.join(timeout=5)

        return stop_it

    def _drain(self) -> None:
        """Let in-flight jobs finish within ``grace_s``, then give the rest back (ready now)
        so another worker takes them at once instead of waiting for the lease."""
        deadline = self.clock() + self.config.grace_s
        if self._snapshot():
            log.info("stopping: %d job(s) in flight get up to %.1f s to finish",
                     len(self._snapshot()), self.config.grace_s, extra=queue_fields("stopping"))
        with self._lock:  # jobs that never got a slot go back at once, free
            waiting = [item for _, item in self._ready]
            self._ready.clear()
        with within(GIVE_BACK_BOUND_S):
            for item in waiting:
                self._give_back(item, NOT_STARTED_REASON)
                self._settle(item)
        if waiting:
            log.info("stopping: %d prefetched job(s) given back", len(waiting),
                     extra=queue_fields("stopping"))
        while self._snapshot() and self.clock() < deadline:
            self._wake.wait(min(deadline - self.clock(), 0.1))
            self._wake.clear()
        with within(GIVE_BACK_BOUND_S):
            for item in self._snapshot():
                self._give_back(item, SHUTDOWN_REASON)
                if item.future is None:
                    self._settle(item)

    def _give_back(self, item: InFlight, reason: str) -> None:
        """Give the job back. Free when its handler never started (under the same lock the
        runner takes to start it, so it then never will); counted toward the policy's
        ``max_givebacks`` when it ran, so a job that outlives every grace period still
        spends its attempts and ends. A job whose completion is being written is left to it."""
        with item.lock:
            if item.finished or item.completing:
                return
            item.finished = True
            item.job.lease_lost = True  # the handler may notice; its result will be discarded
            try:
                item.queue.give_back(item.job, item.started, reason,
                                     max_givebacks=item.policy.max_givebacks)
                if reason == SHUTDOWN_REASON:
                    log.warning("job %s: %s after the grace period; given back", item.job.id,
                                "still running" if item.started else "not started",
                                extra=job_fields("given_back", item.job))
            except LeaseLost:
                pass  # already taken or cancelled: nothing of ours to give back
            except LeaseqError as exc:
                log.error("job %s: could not give it back (%s); its lease will expire",
                          item.job.id, self._why(exc),
                          extra=job_fields("give_back_failed", item.job))
        if item.future is not None:
            item.future.cancel()  # cancels an async handler; a running thread runs on

    def _register(self) -> None:
        """The worker registry's beat (dashboard, ``leaseq doctor``), from the heartbeat."""
        self.store.register_worker(self.worker_id, [q.name for q in self.queues],
                                   len(self._snapshot()))

    def _shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._loop.stop()
        self._finish_writes()
        self._heartbeat.stop()
        with contextlib.suppress(LeaseqError):  # a killed worker is pruned by the sweeper
            self.store.unregister_worker(self.worker_id)

    def _finish_writes(self) -> None:
        """The completer's last batch, then what it handed on to the finisher (a write the
        store refused, tried again within the runner's bounded retries), under heartbeat: a
        completion is never dropped because its thread was shut down first."""
        if self._completer is not None:
            self._completer.close()
        if self._finisher is not None:
            self._finisher.shutdown(wait=True)

    def _install_signals(self, same_stop_s: float = 0.0) -> Callable[[], None]:
        """SIGTERM / SIGINT drain the worker, a second one (more than ``same_stop_s`` later)
        ends it at once (``leaseq.signals.DrainThenExit``); returns what puts the previous
        handlers back."""
        self._signals.same_stop_s = same_stop_s
        self._signals.install()
        return self._signals.restore


def nothing() -> None:
    return None
