"""``execute(job) -> Job`` for an ``App``: the polling worker's own runner and heartbeat, fed by
RabbitMQ deliveries instead of claims.

The consumer must settle each delivery on exactly the outcome the polling worker would write,
so nothing here decides an outcome: ``leaseq.runner.Runner`` runs the handler and writes
``complete`` / ``retry_later`` / ``fail`` / ``snooze``, and ``leaseq.heartbeat.Heartbeat`` keeps
the leases of all in-flight jobs alive in one store call per queue. This module only adapts
their interface (an ``InFlight`` in, an outcome label out) to the consumer's
``Callable[[Job], Job]``.

The local lease clock (DESIGN.md §8) runs here too: the job's lease is trusted from when the
consumer *sent* its claim (``run_claimed``; a plain call trusts it from the call) until a beat
confirms it, and a consumer cut off from its store abandons the job in time exactly as the
worker does: the handler sees ``job.lease_lost`` (an ``async def`` one is cancelled), nothing is
written, and the call raises ``LeaseLost`` (the consumer requeues the delivery: the job is not
finished, and an ack would settle it without a result). The abandonment is logged at once and
journaled (``lease_abandoned``, naming the consumer that claimed the job) once the store
answers again: before the next job this executor runs (its claim just reached the store), or
at ``close``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from leaseq.errors import StoreUnavailable
from leaseq.heartbeat import Heartbeat
from leaseq.job import Job, LeaseLost
from leaseq.lease_clock import AbandonedJournal, Abandoning, abandon
from leaseq.metrics import Metrics
from leaseq.runner import InFlight, LoopThread, Runner, holds_a_thread

if TYPE_CHECKING:
    from leaseq.app import App

Execute = Callable[[Job], Job]


class AppExecutor:
    """Runs claimed jobs of ``app`` as the worker does. Thread-safe; ``close()`` when done."""

    def __init__(self, app: App, metrics: Metrics | None = None, *,
                 lease_margin_s: float = 1.0):
        self.app = app
        self.metrics = metrics or Metrics()
        self._runner = Runner(app, self.metrics)
        self._heartbeat = Heartbeat(self._snapshot, self._runner.lease_lost,
                                    redact=app.redact, on_untrusted=self._abandon,
                                    margin_s=lease_margin_s)
        self._lock = threading.Lock()
        self._in_flight: dict[tuple[str, str], InFlight] = {}
        self._started = False
        self._loop = LoopThread(on_stop=self._close_async)
        self._abandoned = AbandonedJournal(time.monotonic)

    def __call__(self, job: Job) -> Job:
        """``run_claimed`` for a job whose claim was sent just now."""
        return self.run_claimed(job, time.monotonic())

    def run_claimed(self, job: Job, sent_at: float) -> Job:
        """Run ``job``, claimed by the caller with a request sent at ``sent_at``
        (``time.monotonic()``), and return its record after the outcome was written.
        ``LeaseLost`` when the write was fenced out, or the lease clock ran out (before the
        handler started, when the claim's answer came back that late); ``StoreUnavailable``
        when the store refused the write after the runner's own retries (the lease then
        expires)."""
        self._abandoned.write(self.app.store)
        item = self._in_flight_item(job)
        item.claim_sent_at = sent_at
        self._heartbeat.trust(item, sent_at, item.queue.policy.lease_s)
        if item.trusted_until <= time.monotonic():
            # Another consumer may hold the job soon: it never starts here (as in the worker).
            raise LeaseLost(item.queue.name, job.id, job.lease_epoch)
        key = (item.queue.name, job.id)
        with self._lock:
            earlier = self._in_flight.get(key)
            if earlier is not None and claimed_later(earlier, item):
                # Two deliveries of the job's lives reached here in the other order: this is
                # the older claim, whose lease is gone (the store would refuse its writes by
                # its claim token): it never runs.
                raise LeaseLost(item.queue.name, job.id, job.lease_epoch)
            self._in_flight[key] = item
            self._start()
        if earlier is not None:
            # Claimed again while still running here: the earlier lease is gone (see
            # Worker._track); its handler is told to stop.
            self._runner.lease_lost(earlier)
        self._heartbeat.wake()
        try:
            outcome = self._run(item)
        finally:
            with self._lock:
                if self._in_flight.get(key) is item:
                    del self._in_flight[key]
        if outcome in ("lease_lost", "abandoned"):
            raise LeaseLost(item.queue.name, job.id, job.lease_epoch)
        after = item.queue.get(job.id)
        if outcome == "store_error" or after is None:
            raise StoreUnavailable(f"job {job.id[:200]!r}: its outcome could not be saved")
        return after

    async def _close_async(self) -> None:
        """On the handlers' loop as it stops: the async connections they opened there."""
        if self.app.has_open_store():
            await self.app.store.aclose()

    def close(self) -> None:
        with self._lock:
            started = self._started
        if started:
            self._heartbeat.stop()
        self._loop.stop()
        self._abandoned.write(self.app.store)

    def max_givebacks(self, job: Job) -> int:
        """How many times ``job`` may be given back free once its handler started: its task's
        policy's, else its queue's (as the worker gives back)."""
        return self.app.job_policy(job).max_givebacks

    def abandoned_pending(self) -> int:
        """Jobs the lease clock abandoned whose abandonment is not journaled yet."""
        return self._abandoned.pending()

    def _in_flight_item(self, job: Job) -> InFlight:
        queue = self.app.queue(job.queue)
        task = self.app.get_task(job.task)
        policy = self.app.job_policy(job)
        # QueuePolicy fills heartbeat_every_s in (lease_s / 3) when built without one
        every_s = self._heartbeat.every_s(policy.heartbeat_every_s,  # type: ignore[arg-type]
                                          policy.lease_s)
        # The claim took the queue's lease; the first beat (within a third of it) sets the
        # task's own, as in the worker.
        first_beat_s = min(every_s, queue.policy.lease_s / 3)
        return InFlight(job, task, queue, policy.lease_s, every_s, time.monotonic() + first_beat_s)

    def _run(self, item: InFlight) -> str:
        if holds_a_thread(item):
            return self._runner.run_sync(item)
        coro = self._runner.run_async(item, _in_thread)
        item.future = self._loop.submit(coro)
        try:
            return str(item.future.result())
        except CancelledError:
            return "abandoned"  # the lease clock ran out and cancelled the handler

    def _abandon(self, item: InFlight) -> bool:
        """The lease clock of ``item`` ran out (heartbeat thread): ``abandon`` it (the call
        then raises ``LeaseLost``); False while its finishing write holds it (that write is
        fenced)."""
        return abandon(item, self._runner, self._abandoned, time.monotonic) is not Abandoning.BUSY

    def _start(self) -> None:
        if not self._started:
            self._started = True
            self._heartbeat.start()

    def _snapshot(self) -> list[InFlight]:
        with self._lock:
            return list(self._in_flight.values())


def claimed_later(one: InFlight, other: InFlight) -> bool:
    """Whether ``one``'s claim of a job came after ``other``'s: the store's clock stamps
    ``updated_at`` in the claim; on equal stamps (a coarse clock), the claim sent later."""
    def order(item: InFlight) -> tuple[datetime, float]:
        return (item.job.updated_at or datetime.min.replace(tzinfo=UTC), item.claim_sent_at)

    return order(one) > order(other)


def _in_thread(fn: Callable[..., str], *args: Any) -> Any:
    """The runner's ``finish_in``: the store write runs off the event loop."""
    return asyncio.get_running_loop().run_in_executor(None, fn, *args)


def app_executor(app: App) -> AppExecutor:
    return AppExecutor(app)
