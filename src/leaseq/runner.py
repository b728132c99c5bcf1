"""Running one claimed job and turning what its handler did into one fenced store write.

DESIGN.md §3, handler outcomes: a return value → ``complete`` (``Finish`` for an app status or
follow-up jobs); ``Retry`` or any unexpected exception → ``retry_later`` (the store turns it into
``failed(exhausted)`` when attempts are spent); ``Permanent`` or a type the task lists as
permanent → ``fail(permanent)``; ``Snooze`` → ``snooze`` (no delay given: the policy's
``snooze_s``; bounded by its ``max_snoozes``); unknown task or a payload that no longer fits →
``fail(invalid)``. This is also the one place that records the outcome metrics.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from leaseq import validate
from leaseq.app import App, Finish, PayloadMismatch, Task
from leaseq.completer import Completer
from leaseq.errors import InvalidInput, LeaseqError, StoreUnavailable
from leaseq.job import Failure, Job, LeaseLost, Permanent, Retry, Snooze, safe_reason
from leaseq.journal import JournalEvent
from leaseq.logfields import job_fields, queue_fields
from leaseq.metrics import Metrics
from leaseq.policy import QueuePolicy
from leaseq.queue import Queue
from leaseq.redact import traceback_text

log = logging.getLogger(__name__)

#: Pauses between tries of a finishing write the store could not take (a busy database).
WRITE_RETRY_PAUSES_S = (0.1, 0.5, 2.0)
#: What ``finish`` returns when the completion went to the completer (not yet written).
COMPLETING = "completing"
#: Journal events of a finishing write (the job leaves ``processing`` under its lease).
FINISH_EVENTS = frozenset({JournalEvent.RESULT_SAVED, JournalEvent.QUARANTINED,
                           JournalEvent.RETRY_SCHEDULED, JournalEvent.SNOOZED,
                           JournalEvent.GIVEN_BACK})


def in_new_thread(fn: Callable[[], None]) -> None:
    threading.Thread(target=fn, name="leaseq-finish-again", daemon=True).start()


def _nothing(item: object) -> None:
    return None


@dataclass(eq=False)
class InFlight:
    """A claimed job while this worker holds it. ``lock`` serialises the handler's finishing
    write with the heartbeat, so a beat never races a completion into a false ``lease lost``."""

    job: Job
    task: Task | None
    queue: Queue
    lease_s: float
    """The lease each beat extends to: the task's, else the queue's."""
    heartbeat_every_s: float
    next_beat_at: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    finished: bool = False
    """Set once the finishing write was made (or given up): the heartbeat leaves it alone."""
    started: bool = False
    """Set (under ``lock``) just before the handler is called: a give-back at shutdown is free
    for a job whose handler never started, and counted for one that did."""
    slot_taken_at: float = 0.0
    """When the job got a slot (worker clock): how long handlers hold one paces prefetch."""
    completing: bool = False
    """Set (under ``lock``) when the completion went to the completer: the job stays in
    flight until its batch commits, but is neither beaten nor given back any more."""
    future: Future[Any] | None = None
    claim_sent_at: float = float("-inf")
    """When the claim was sent (worker clock): of two claims of one job, the later one holds
    it (``delivery.execute.claimed_later``)."""
    confirmed_at: float = float("-inf")
    """When the request that last confirmed the lease (the claim, or a beat) was sent."""
    trusted_until: float = float("inf")
    """The local lease clock (worker's monotonic clock): when the request that last confirmed
    the lease was sent, plus the lease, minus the worker's margin. Past it the worker abandons
    the job, whatever the network does, before the store can hand it to another worker."""
    slotted: bool = False
    """Set (under the worker's lock) when the job took a slot (it had waited for one)."""
    landed: bool = False
    """Set (under the worker's lock) when the handler gave its slot back."""
    settled_first: bool = False
    """Set (under the worker's lock) when its outcome was written before its handler's run
    gave the slot back: the slot is taken a moment longer with nothing in flight."""
    abandoned: bool = False
    """Set (under the worker's lock) when the lease clock ran out and the slot was freed
    while the handler still ran; its landing then frees nothing."""

    @property
    def policy(self) -> QueuePolicy:
        """The policy the job runs under: its task's, else its queue's."""
        return self.task.policy if self.task else self.queue.policy


@dataclass(frozen=True, slots=True)
class Ran:
    """What the handler did: returned ``value`` or raised ``error``, in ``duration_s``."""

    value: Any = None
    error: BaseException | None = None
    duration_s: float | None = None


class Runner:
    def __init__(self, app: App, metrics: Metrics, *, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, completer: Completer | None = None,
                 fallback: Callable[[Callable[[], None]], object] = in_new_thread,
                 on_settled: Callable[[InFlight], None] = _nothing):
        self.completer = completer
        """Batches plain completions into one statement; None writes each on its own."""
        self.fallback = fallback
        """Runs a completion again on its own after the completer's batch failed."""
        self.on_settled = on_settled
        """Told when a job handed to the completer is settled (its outcome written or lost)."""
        self.app = app
        self.metrics = metrics
        self.sleep = sleep
        self.clock = clock

    # --- running ---------------------------------------------------------------------------

    def run_sync(self, item: InFlight) -> str:
        """Run a sync handler (in a pool thread) and write its outcome; returns the outcome."""
        kwargs, ran = self._prepare(item)
        if ran is None:
            if not self._begin(item):
                return "abandoned"
            started = self.clock()
            try:
                # a job with no task never gets here: ``_prepare`` made it invalid
                value = item.task.func(**kwargs)  # type: ignore[union-attr]
            except BaseException as exc:  # SystemExit too: a failed attempt, written as such
                ran = Ran(error=exc, duration_s=self.clock() - started)
            else:
                ran = Ran(value=value, duration_s=self.clock() - started)
        return self.finish(item, ran)

    async def run_async(self, item: InFlight, finish_in: Callable[..., Any]) -> str:
        """Run an ``async def`` handler on the worker's loop; the store write runs off the loop
        (``finish_in``: an executor's ``run_in_executor``-style call) so it never blocks it."""
        kwargs, ran = self._prepare(item)
        if ran is None:
            if not self._begin(item):
                return "abandoned"
            started = self.clock()
            try:
                # as in run_sync: ``_prepare`` made a job with no task invalid
                value = await item.task.func(**kwargs)  # type: ignore[union-attr]
            except asyncio.CancelledError as exc:
                if cancelled_by_worker():
                    raise  # given back (drain, the loop's stop) or its lease lost: no write
                ran = Ran(error=exc, duration_s=self.clock() - started)
            except BaseException as exc:  # as in run_sync
                ran = Ran(error=exc, duration_s=self.clock() - started)
            else:
                ran = Ran(value=value, duration_s=self.clock() - started)
        return await finish_in(self.finish, item, ran)

    @staticmethod
    def _begin(item: InFlight) -> bool:
        """Mark the handler started, unless the job was given back first: then it must not
        run at all (its give-back was free because it had not started)."""
        with item.lock:
            if item.finished:
                return False
            item.started = True
            return True

    def _prepare(self, item: InFlight) -> tuple[dict[str, Any], Ran | None]:
        """The handler's arguments, or a ``Ran`` that already says the job is invalid."""
        if item.task is None:
            name = item.job.task
            return {}, Ran(error=_Invalid(f"unknown task {name!r}" if name else "job has no task"))
        try:
            return item.task.arguments(item.job), None
        except PayloadMismatch as exc:
            return {}, Ran(error=_Invalid(str(exc)))

    # --- outcomes --------------------------------------------------------------------------

    def finish(self, item: InFlight, ran: Ran) -> str:
        """Write the outcome (fenced) unless the lease is gone; record it. Returns the outcome
        label used in ``leaseq_processed_total``, or ``COMPLETING`` when a plain completion
        went to the completer: the item is then settled (``on_settled``) once its batch
        committed, and the calling thread is free for its next job at once."""
        with item.lock:
            if item.finished or item.completing:
                return "abandoned"  # the worker already gave the job back at shutdown
            handed = self._hand_over(item, ran)
            if handed is None:
                try:
                    outcome = self._write_outcome(item, ran)
                finally:
                    item.finished = True
        if handed is not None:
            # Outside the item's lock: after ``close`` the completer answers in this thread.
            # (Not None: ``_hand_over`` hands nothing over without a completer.)
            self.completer.submit(item.queue, item.job.lease, *handed,  # type: ignore[union-attr]
                                  lambda answer: self._completed(item, ran, answer))
            return COMPLETING
        self._record(item, outcome, ran)
        return outcome

    def _hand_over(self, item: InFlight, ran: Ran) -> tuple[str | None, str, str | None] | None:
        """A plain completion for the next group commit: its (result_json, status,
        result_key); None when this outcome needs its own write (no completer, an error,
        follow-up jobs, a result leaseq cannot store: the direct path then quarantines it
        with the reason)."""
        if self.completer is None or ran.error is not None or item.job.lease_lost:
            return None
        done = ran.value if isinstance(ran.value, Finish) else Finish(result=ran.value)
        if done.then:
            return None
        try:
            result_json = validate.result(done.result, item.queue.policy.max_payload_bytes)
            status = validate.terminal_status(done.status)
            result_key = validate.result_key(done.result_key)
        except InvalidInput:
            return None
        # Set under the item's lock, like ``finished``: the heartbeat leaves the job alone from
        # here (a beat after the commit would report it lost) and a give-back cannot take it.
        item.completing = True
        return result_json, status, result_key

    def _completed(self, item: InFlight, ran: Ran, answer: Job | BaseException) -> None:
        """The completer answered (its thread): record the outcome and settle the item. A
        write the store could not take is tried again on its own, off the completer."""
        if isinstance(answer, BaseException) and not isinstance(answer, LeaseLost):
            unknown = isinstance(answer, StoreUnavailable)  # the batch may have committed
            self.fallback(lambda: self._complete_directly(item, ran, unknown))
            return
        if isinstance(answer, Job):
            outcome = _label("complete", answer)
        else:
            self.lease_lost(item)
            log.warning("job %s: lease lost before its outcome was saved; result discarded",
                        item.job.id, extra=job_fields("lease_lost", item.job))
            outcome = "lease_lost"
        with item.lock:
            item.finished = True
        self._record(item, outcome, ran)
        self.on_settled(item)

    def _complete_directly(self, item: InFlight, ran: Ran, unknown: bool = False) -> None:
        with item.lock:
            try:
                outcome = self._write_outcome(item, ran, unknown)
            finally:
                item.finished = True
        self._record(item, outcome, ran)
        self.on_settled(item)

    def _record(self, item: InFlight, outcome: str, ran: Ran) -> None:
        if outcome != "lease_lost":
            self.metrics.job_finished(item.queue.name, outcome, ran.duration_s)

    def _write_outcome(self, item: InFlight, ran: Ran, unknown: bool = False) -> str:
        """Write the outcome, fenced; tried again after a store error. A write whose outcome
        is unknown (``unknown``, or a try that failed) is never assumed done nor undone: the
        retry is fenced, and when it is refused the journal says whether the earlier one was
        saved under this lease."""
        job = item.job
        if job.lease_lost:
            log.warning("job %s: lease lost during attempt %d; result discarded", job.id,
                        job.attempts, extra=job_fields("lease_lost", job))
            return "lease_lost"
        action, call = self._decide(item, ran)
        for pause in (*WRITE_RETRY_PAUSES_S, None):
            try:
                return _label(action, call())
            except LeaseLost:
                landed = self._landed_earlier(item) if unknown else None
                if landed is not None:
                    log.info("job %s: an earlier write of unknown outcome had been saved",
                             job.id)
                    return _label(action, landed)
                self.lease_lost(item)
                log.warning("job %s: lease lost before its outcome was saved; result discarded",
                            job.id, extra=job_fields("lease_lost", job))
                return "lease_lost"
            except StoreUnavailable as exc:
                unknown = True  # it may have committed: a refused retry is then looked up
                if pause is None:
                    # Give up: the lease runs out and the job is reclaimed and run again.
                    log.error("job %s: cannot save its outcome (%s); it will be retried after "
                              "its lease expires", job.id, self._why(exc),
                              extra=job_fields("save_failed", job))
                    return "store_error"
                self.sleep(pause)
            except Exception as exc:  # any other refusal: see _unwritable
                return self._unwritable(item, action, exc)
        raise AssertionError("unreachable")

    def _unwritable(self, item: InFlight, action: str, error: Exception) -> str:
        """The outcome's write raised what no retry can help (a follow-up of the wrong shape,
        a value the store's driver refuses): the job fails for good with that reason. Left
        unwritten, it would stay processing until its lease ran out, and run again, side
        effects and all, until it ended as failed(expired) with the real cause lost."""
        job = item.job
        log.error("job %s: its outcome (%s) could not be written; failed for good\n%s", job.id,
                  action, traceback_text(error, self.app.redact),
                  extra=job_fields("unwritable_outcome", job))
        try:
            return _label("fail", item.queue.fail(
                job, f"its outcome ({action}) could not be written: "
                     f"{safe_reason(error, redact=self.app.redact)}", Failure.PERMANENT))
        except LeaseLost:
            self.lease_lost(item)
            return "lease_lost"
        except Exception as exc:  # the lease runs out and the job comes back
            log.error("job %s: cannot save its failure either (%s)", job.id, self._why(exc),
                      extra=job_fields("save_failed", job))
            return "store_error"

    @staticmethod
    def _landed_earlier(item: InFlight) -> Job | None:
        """The job as saved, when its journal holds a finish under this very lease (an
        earlier try did commit); None when it does not, or cannot be read. The journal of a
        job deleted and enqueued again goes on with the new life's, whose epochs start again:
        a finish by another worker under the same epoch is not this one's (the journal does
        not keep claim tokens, so this worker's own two claims stay alike here)."""
        job = item.job
        try:
            saved = any(e.lease_epoch == job.lease_epoch and e.event in FINISH_EVENTS
                        and e.worker_id in (None, job.worker_id)
                        for e in item.queue.journal(job.id))
            return item.queue.get(job.id) if saved else None
        except LeaseqError:
            return None

    def _decide(self, item: InFlight, ran: Ran) -> tuple[str, Callable[[], Job]]:
        """The store call for this outcome, and its action name."""
        job, queue, error = item.job, item.queue, ran.error
        if error is None:
            return self._complete(item, ran.value)
        if isinstance(error, Snooze):
            policy = item.policy
            delay = policy.snooze_s if error.delay_s is None else error.delay_s
            return "snooze", lambda: queue.snooze(job, delay, str(error),
                                                  max_snoozes=policy.max_snoozes)
        if isinstance(error, _Invalid):
            log.warning("job %s: quarantined as invalid: %s", job.id, self._why(str(error)),
                        extra=job_fields("invalid", job))
            return "fail", lambda: queue.fail(job, str(error), Failure.INVALID)
        # An explicit Retry wins over the task's permanent= types, which it would match when
        # they are as wide as Exception ("every error is permanent unless I say Retry").
        permanent = isinstance(error, Permanent) or (
            item.task and not isinstance(error, Retry) and isinstance(error, item.task.permanent))
        if permanent:
            log.warning("job %s: permanent failure on attempt %d: %s", job.id, job.attempts,
                        self._why(error), extra=job_fields("permanent", job))
            return "fail", lambda: queue.fail(job, error, Failure.PERMANENT)
        # Decided (and logged) once: the write may be tried again, its delay must not change
        retry_in = self._retry_delay(item, error)
        return "retry", lambda: queue.retry_later(job, error, retry_in)

    def _complete(self, item: InFlight, value: Any) -> tuple[str, Callable[[], Job]]:
        job, queue = item.job, item.queue
        done = value if isinstance(value, Finish) else Finish(result=value)

        def complete() -> Job:
            try:
                return queue.complete(job, done.result, status=done.status,
                                      result_key=done.result_key, then=done.then)
            except InvalidInput as exc:  # not JSON, a live status, a bad key: retrying can't help
                log.warning("job %s: handler returned a result leaseq cannot store: %s",
                            job.id, self._why(exc), extra=job_fields("unstorable_result", job))
                return queue.fail(job, exc, Failure.PERMANENT)

        return "complete", complete

    def _retry_delay(self, item: InFlight, error: BaseException) -> float | None:
        job = item.job
        if isinstance(error, Retry):
            log.info("job %s: retry requested on attempt %d: %s", job.id, job.attempts,
                     self._why(error), extra=job_fields("retry_requested", job))
            if error.delay_s is not None:
                return error.delay_s
        else:
            # The traceback goes to the log with the job id, its messages redacted like the
            # journal's reason; never the payload.
            log.warning("job %s (task %s) raised on attempt %d of %d: %s\n%s", job.id, job.task,
                        job.attempts, job.max_attempts, self._why(error),
                        traceback_text(error, self.app.redact),
                        extra=job_fields("handler_raised", job))
        policy = item.policy
        return None if policy == item.queue.policy else policy.backoff_s(job.attempts)

    def _why(self, error: BaseException | str) -> str:
        """An error as a log line may show it: the journal's reason, with the app's redactor."""
        return safe_reason(error, redact=self.app.redact)

    def lease_lost(self, item: InFlight) -> None:
        """The lease is gone: the handler may notice (``job.lease_lost``); its result will be
        discarded. Counted once per attempt."""
        if not item.job.lease_lost:
            item.job.lease_lost = True
            self.metrics.lease_lost(item.queue.name)


def cancelled_by_worker() -> bool:
    """Whether the running handler's task was cancelled from outside: only the worker cancels
    it (a give-back, a lost lease, the stop of its loop). A ``CancelledError`` the handler's
    own code let out (a child task it awaited was cancelled) leaves the count at 0: that is a
    failed attempt, retried by the policy, not a shutdown."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def holds_a_thread(item: InFlight) -> bool:
    """Whether the job's handler runs in a pool thread (sync), not on the event loop."""
    return item.task is None or not item.task.is_async


class LoopThread:
    """One event loop for every ``async def`` handler, in its own daemon thread, started on
    first use (a worker with only sync tasks never starts it).

    ``submit`` and ``stop`` take turns under one lock, so a coroutine is either handed to the
    loop before its stop is queued, or to a new loop after it: never left in the queue of a
    loop that stopped. The stop cancels every task still on the loop, waits for them to end,
    awaits ``on_stop`` (the store's ``aclose``: the async connections its handlers opened on
    this loop), then closes the loop: nothing it was given is dropped unstarted."""

    def __init__(self, on_stop: Callable[[], Awaitable[None]] | None = None) -> None:
        self._on_stop = on_stop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> Future[Any]:
        """Run ``coro`` on the loop (``asyncio.run_coroutine_threadsafe``)."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=_serve, args=(self._loop,),
                                                name="leaseq-async", daemon=True)
                self._thread.start()
            return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def stop(self) -> None:
        """Cancel what runs on the loop, then stop and close it (in its thread; this call
        does not wait: ``join`` does)."""
        with self._lock:
            loop, self._loop = self._loop, None
            if loop is not None:
                loop.call_soon_threadsafe(loop.create_task, _cancel_all_then_stop(self._on_stop))

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the last loop's thread to end (after ``stop``)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


async def _cancel_all_then_stop(on_stop: Callable[[], Awaitable[None]] | None) -> None:
    """The loop's last task: cancel every other one (a task whose coroutine never started is
    closed by it), wait for them all, await ``on_stop``, then stop the loop."""
    this = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not this]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    try:
        if on_stop is not None:
            await on_stop()
    except Exception as exc:  # the loop stops all the same: a connection left is GC's
        log.warning("closing the async handlers' connections failed: %s",
                    safe_reason(exc), extra=queue_fields("async_close_failed"))
    finally:
        asyncio.get_running_loop().stop()


class _Invalid(Exception):
    """The job cannot run here: unknown task or a payload that does not fit."""


def _label(action: str, job: Job) -> str:
    """The outcome as the store saw it: a retry on the last attempt, or a snooze past the
    bound, became ``failed(exhausted)``; a stale job's finish became a give-back, which starts
    the new revision with every counter at 0 (a retry keeps its attempt, a snooze counts)."""
    if job.status == "failed":
        return str(job.failure or "failed")
    if job.status == "pending":
        if action == "retry" and job.attempts:
            return "retried"
        if action == "snooze" and job.snoozes:
            return "snoozed"
        return "given_back"
    return job.status
