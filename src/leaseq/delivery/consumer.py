"""The consumer: a delivery is a wake-up for one job id; the store decides what happens.

Per delivery, in this order (the order is the guarantee):

1. journal ``received`` (redelivered flag, delivery count);
2. ``claim_one`` that job, noting when the claim was sent (the job's lease clock starts then).
   Not claimable (terminal, not due, held by a live lease, unknown) → ack, no effect: the store
   said so, and a job held by a lease is owed its publish again when that lease lapses (reclaim).
   Except a redelivery of a job already ``failed``: its last consumer went before its nack, so
   it is nacked now (``requeue=False``) and dead-lettered as that nack would have. And except a
   redelivery of a job whose handler still runs *here*, under the lease this consumer holds, its
   first delivery's session gone (a broker restart, a network blip, a store error on another
   delivery): that delivery's settle cannot go out any more, so this one is held unacked and
   settled by the handler's outcome, on the new channel. Acked, the job's message would be gone
   before its outcome, and a ``failed`` one would never reach the quarantine queue;
3. run it with the same ``execute`` the polling worker uses; it writes the outcome durably;
4. only then settle the delivery on the channel it came on (``Settlement``):
   ``nack(requeue=False)`` when the job ended ``failed`` (the dead-letter exchange puts the
   message into the quarantine queue); ``nack(requeue=True)`` when the job was not finished here
   (``LeaseLost``: the lease clock abandoned it, cut off from the store, or its write was fenced
   out), so the message goes back to RabbitMQ instead of being acked without a result; ack
   otherwise (done, retry written, snoozed). A retry is never requeued: that is the hot loop.
   A lost lease cannot loop: each requeue follows a claim that spent an attempt, and its
   redelivery is claimed, or acked while a lease holds the job, or (store still unreachable)
   drops the session, which the reconnect backoff paces and ``x-delivery-limit`` ends;
5. journal ``ack_sent``.

A crash anywhere before 4 leaves the message unacked; RabbitMQ redelivers it and step 2 finds
the job terminal, or held by the dead consumer's lease until it expires and the dispatcher's
reclaim makes it owed again.

pika is not thread-safe: handlers run in a thread pool, and every ack / nack is handed to the
connection's thread with ``add_callback_threadsafe``.

A delivery waiting for a pool thread starts only while its session is open and the consumer is
not stopping; otherwise it never claims its job, and its message goes back to RabbitMQ with the
closed channel. On stop, what runs gets ``grace_s`` to finish; what still runs then is given
back (``give_back``: ready at once, counted toward ``max_givebacks``), as the worker does.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from leaseq.delivery.connection import Reconnect, amqp_errors, decode, reconnecting, session
from leaseq.delivery.registry import RegistryBeat
from leaseq.delivery.topology import Topology
from leaseq.errors import InvalidInput, LeaseqError
from leaseq.job import Job, JobStatus, LeaseLost, is_terminal, safe_reason
from leaseq.journal import JournalEvent
from leaseq.logfields import job_fields, queue_fields
from leaseq.redact import combined, traceback_text

if TYPE_CHECKING:
    from pika import BlockingConnection
    from pika.adapters.blocking_connection import BlockingChannel

    from leaseq.queue import Queue

log = logging.getLogger(__name__)

SHUTDOWN_REASON = "consumer shutting down: given back to be taken at once"
HELD_REASON = "settled on its redelivery, held while its handler ran here"

#: Runs the task of a claimed job, keeps its lease alive meanwhile, writes its outcome through
#: the Queue and returns the resulting record; raises ``LeaseLost`` when the write was fenced
#: out. ``leaseq.delivery.execute.AppExecutor`` is the polling worker's own runner.
Execute = Callable[[Job], Job]


@runtime_checkable
class ExecuteClaimed(Protocol):
    """An ``Execute`` that also takes when the claim was sent (monotonic clock), so that the
    job's lease clock starts then, not when the answer came back (``AppExecutor``). A plain
    ``Execute`` is called as it is."""

    def run_claimed(self, job: Job, sent_at: float) -> Job: ...


@runtime_checkable
class BoundsGivebacks(Protocol):
    """An ``Execute`` that knows the policy each job runs under, so that a stop gives a job back
    under its task's ``max_givebacks`` (``AppExecutor``). Otherwise its queue's is used."""

    def max_givebacks(self, job: Job) -> int: ...


class Settlement(StrEnum):
    """How a delivery is settled, once the store has the job's outcome (or said why not)."""

    ACK = "ack"
    """Done, retry written, snoozed, or not claimable: nothing more is owed to this message."""
    QUARANTINE = "nack requeue=false"
    """The job ended ``failed``: the dead-letter exchange moves the message to quarantine."""
    REQUEUE = "nack requeue=true"
    """The job was not finished here (lease lost): the message goes back to RabbitMQ."""


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """How a consumer takes deliveries. Validated when built."""

    concurrency: int = 4
    """Handler threads, and the prefetch per queue (free slots). Defaults to 4."""
    grace_s: float = 30.0
    """On stop, how long in-flight jobs may run on before the connection closes; what still
    runs then is given back. Defaults to 30 s."""
    settle_timeout_s: float = 30.0
    """Longest wait for the connection's thread to send one ack. Defaults to 30 s."""
    max_backoff_s: float = 10.0
    """Longest wait between reconnects to RabbitMQ. Defaults to 10 s."""

    def __post_init__(self) -> None:
        c = self.concurrency
        if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= 1000:
            raise InvalidInput(f"concurrency must be a whole number from 1 to 1000, got {c!r}")
        for name in ("grace_s", "settle_timeout_s", "max_backoff_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise InvalidInput(f"{name} must be a number of seconds ≥ 0, got {value!r}")


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(slots=True)
class _Session:
    """One connection's life: acks for its deliveries go through it or not at all."""

    conn: BlockingConnection
    channel: BlockingChannel
    closed: threading.Event
    broken: BaseException | None = None


@dataclass(eq=False, slots=True)
class _Running:
    """A delivery whose handler started; ``job`` once its claim came back."""

    queue: str
    session: _Session
    job: Job | None = None
    held: list[_Delivery] = field(default_factory=list)
    """Redeliveries of ``job`` that arrived on a later session while the handler ran; settled
    with this delivery's outcome (under ``Consumer._lock``)."""
    finished: bool = False
    """Set (under ``Consumer._lock``) once the outcome is known: nothing is held after it."""


@dataclass(frozen=True, slots=True)
class _Delivery:
    session: _Session
    queue: str
    tag: int
    redelivered: bool
    delivery_count: int
    body: bytes


class Consumer:
    """Takes deliveries of ``queues`` from RabbitMQ and runs them with ``execute``."""

    def __init__(self, queues: Sequence[Queue], execute: Execute, amqp_url: str, *,
                 topology: Topology | None = None, config: ConsumerConfig | None = None,
                 worker_id: str | None = None, declare: bool = True):
        if not queues:
            raise InvalidInput("a consumer needs at least one queue")
        self.queues: Mapping[str, Queue] = {q.name: q for q in queues}
        self.execute = execute
        self._execute: Callable[[Job, float], Job] = (
            execute.run_claimed if isinstance(execute, ExecuteClaimed)
            else lambda job, _sent_at: execute(job))
        self.amqp_url = amqp_url
        self.topology = topology or Topology()
        self.config = config or ConsumerConfig()
        self.worker_id = worker_id or new_worker_id()
        self.declare = declare
        self._warned: set[str] = set()
        """Holding queues whose default delivery limit was logged (once per start)."""
        self.redact = combined(q.redact for q in queues)
        """Masks the errors the consumer logs about its connection: every queue's redactor
        (``Queue.redact``, its app's); a delivery's own errors get its queue's."""
        self._lock = threading.Lock()
        self._landed = threading.Condition(self._lock)
        """Notified (under ``_lock``) whenever a delivery's handler ends."""
        self._running: set[_Running] = set()
        self._stopping = False
        """Set (under ``_lock``) when the drain begins: no delivery starts after it."""
        self._past_grace = False
        """Set (under ``_lock``) when the grace ends: a claim that comes back later is given
        back at once instead of run."""

    # --- the connection's thread -----------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Consume until ``stop`` is set, reconnecting after whatever a lost connection or a
        store outage raises; then let in-flight jobs finish within ``grace_s``.
        ``TopologyError`` (and any other refusal of leaseq's own) is raised at once."""
        self._stopping = self._past_grace = False
        pool = ThreadPoolExecutor(self.config.concurrency, "leaseq-consumer")
        # Registered until its last job is settled or given back: the dashboard and leaseq
        # doctor see it serve its queues.
        with RegistryBeat(self.worker_id, list(self.queues.values()), self._in_flight,
                          redact=self.redact):
            try:
                reconnecting(lambda: self._session(pool, stop), stop, "consumer",
                             self.config.max_backoff_s, self.redact)
            finally:
                self._stop_starting()
                self._give_back_orphans()
                # Not waited for: a queued delivery would never start, and a handler still
                # running past the grace was given back (its write will be fenced out).
                pool.shutdown(wait=False, cancel_futures=True)

    def _session(self, pool: ThreadPoolExecutor, stop: threading.Event) -> None:
        with session(self.amqp_url, f"leaseq-consumer {self.worker_id}") as conn:
            self.topology.ensure(conn, self.queues, declare=self.declare, warned=self._warned)
            channel = conn.channel()
            channel.basic_qos(prefetch_count=self.config.concurrency)
            state = _Session(conn, channel, threading.Event())
            channel.add_on_cancel_callback(lambda _frame: self._cancelled_by_broker(state))
            try:
                for name in self.queues:
                    channel.basic_consume(self.topology.work_queue(name),
                                          self._callback(pool, state, name))
                log.info("consumer %s: consuming %s", self.worker_id, ", ".join(self.queues),
                         extra=queue_fields("consuming"))
                self._pump(state, stop)
                self._drain(state)
            finally:
                state.closed.set()

    def _pump(self, state: _Session, stop: threading.Event) -> None:
        while not stop.is_set():
            state.conn.process_data_events(time_limit=0.2)
            if state.broken is not None:
                raise state.broken
            # A channel the broker closed (consumer_timeout, a channel error) delivers nothing
            # more, and process_data_events does not raise for it.
            if state.channel.is_closed:
                raise Reconnect("RabbitMQ closed the consumer's channel")

    def _cancelled_by_broker(self, state: _Session) -> None:
        """pika's ``on_cancel`` callback (the connection's thread): RabbitMQ cancelled one of
        the session's consumers (its queue was deleted, or it timed out). Nothing arrives for
        it again on this channel, so the session is dropped as a broken one: the next declares
        the topology again and consumes anew."""
        log.warning("consumer %s: RabbitMQ cancelled a consumer; reconnecting", self.worker_id,
                    extra=queue_fields("cancelled_by_broker"))
        state.broken = Reconnect("RabbitMQ cancelled the consumer")

    def _drain(self, state: _Session) -> None:
        """Stop taking deliveries; keep sending acks while in-flight jobs finish within
        ``grace_s``; then give back the jobs still running."""
        self._stop_starting()
        for tag in list(state.channel.consumer_tags):
            state.channel.basic_cancel(tag)
        deadline = time.monotonic() + self.config.grace_s
        while self._in_flight() and (left_s := deadline - time.monotonic()) > 0:
            state.conn.process_data_events(time_limit=min(0.1, left_s))
        self._give_back_all(self._end_grace())

    def _give_back_orphans(self) -> None:
        """A stop that found no session open (it came during a reconnect's backoff, or the
        session failed): the handlers a dropped session left running get ``grace_s`` to
        finish (their acks cannot be sent; RabbitMQ already took their messages back), then
        what still runs is given back, as ``_drain`` does. Nothing to do after a ``_drain``."""
        with self._lock:
            if self._past_grace:
                return
            self._landed.wait_for(lambda: not self._running, timeout=self.config.grace_s)
        self._give_back_all(self._end_grace())

    def _give_back_all(self, left: list[_Running]) -> None:
        if left:
            log.warning("consumer %s: %d jobs still running after the grace period; given "
                        "back, their messages return to RabbitMQ", self.worker_id, len(left),
                        extra=queue_fields("grace_expired"))
        for running in left:
            if running.job is not None:
                self._give_back(running.queue, running.job, started=True)

    def _stop_starting(self) -> None:
        # Under the lock a handler takes to start: each delivery has either started (and is
        # waited for) or never will.
        with self._lock:
            self._stopping = True

    def _in_flight(self) -> int:
        with self._lock:
            return len(self._running)

    def _end_grace(self) -> list[_Running]:
        """The deliveries still running; from now on a claim that comes back is given back."""
        with self._lock:
            self._past_grace = True
            return list(self._running)

    def _give_back(self, queue_name: str, job: Job, *, started: bool) -> None:
        """Back to pending, ready at once (free when the handler never ``started``). The
        handler may see ``lease_lost``; its own write is fenced out either way."""
        job.lease_lost = True
        bound = (self.execute.max_givebacks(job) if isinstance(self.execute, BoundsGivebacks)
                 else None)
        try:
            self.queues[queue_name].give_back(job, started, SHUTDOWN_REASON,
                                              max_givebacks=bound)
            log.warning("consumer %s: job %s %s after the grace period; given back",
                        self.worker_id, job.id[:200], "still running" if started else "claimed",
                        extra=job_fields("given_back", job))
        except LeaseLost:
            pass  # finished, or taken by another, meanwhile: nothing of ours to give back
        except LeaseqError as exc:
            log.error("consumer %s: job %s could not be given back (%s); its lease will expire",
                      self.worker_id, job.id[:200],
                      safe_reason(exc, redact=self.queues[queue_name].redact),
                      extra=job_fields("give_back_failed", job))

    def _callback(self, pool: ThreadPoolExecutor, state: _Session,
                  queue: str) -> Callable[[Any, Any, Any, bytes], None]:
        """pika's ``on_message_callback`` for ``queue``."""
        def on_message(_channel: Any, method: Any, properties: Any, body: bytes) -> None:
            self._on_message(pool, state, queue, method, properties, body)
        return on_message

    def _on_message(self, pool: ThreadPoolExecutor, state: _Session, queue: str, method: Any,
                    props: Any, body: bytes) -> None:
        headers = props.headers or {}
        count = headers.get("x-delivery-count", 0)
        delivery = _Delivery(state, queue, method.delivery_tag, bool(method.redelivered),
                             int(count) if isinstance(count, int) else 0, body)
        pool.submit(self._handle, delivery)

    # --- handler threads -------------------------------------------------------------------

    def _handle(self, d: _Delivery) -> None:
        running = self._start(d)
        if running is None:
            return  # its message goes back to RabbitMQ with the closed channel
        try:
            outcome = self._process(d, running)
            if outcome is None:
                return  # held: the handler running its job here settles it
            job, settlement, reason = outcome
            held = self._finish(running)
            self._settle(d, job, settlement, reason)
            for redelivery in held:
                self._settle(redelivery, job, settlement, f"{reason}; {HELD_REASON}")
        except BaseException as exc:  # a store error: the message must come back, unacked
            redact = self.queues[d.queue].redact
            log.error("consumer %s: delivery %d of queue %r not settled (%s); reconnecting so "
                      "RabbitMQ returns it\n%s", self.worker_id, d.tag, d.queue,
                      safe_reason(exc, redact=redact), traceback_text(exc, redact),
                      extra=queue_fields("unsettled", d.queue))
            broken = (exc if isinstance(exc, amqp_errors())
                      else Reconnect(safe_reason(exc, redact=redact)))
            for each in (d, *self._finish(running)):
                each.session.broken = broken
        finally:
            with self._lock:
                self._running.discard(running)
                self._landed.notify_all()

    def _start(self, d: _Delivery) -> _Running | None:
        """The delivery's record among the running ones; None when it must not start: the
        consumer is stopping, or its session closed (RabbitMQ took its message back)."""
        with self._lock:
            if self._stopping or d.session.closed.is_set():
                return None
            running = _Running(d.queue, d.session)
            self._running.add(running)
            return running

    def _hold(self, running: _Running, job: Job) -> bool:
        """Note the claimed job, so that a stop past the grace gives it back; False when the
        grace already ended (the job is then given back free: it never started)."""
        with self._lock:
            if not self._past_grace:
                running.job = job
                return True
        self._give_back(running.queue, job, started=False)
        return False

    def _finish(self, running: _Running) -> list[_Delivery]:
        """The redeliveries held for ``running``, to settle with its outcome; none can be held
        for it after this (``_hold_redelivery`` then reads the store again)."""
        with self._lock:
            running.finished = True
            held, running.held = running.held, []
            return held

    def _hold_redelivery(self, d: _Delivery, current: Job) -> bool:
        """Hold ``d`` for the handler that runs ``current`` here under the very lease the
        store shows, when that handler's own delivery came on a session now closed (its
        settle cannot go out). False when no such handler runs, or it has its outcome."""
        with self._lock:
            for running in self._running:
                job = running.job
                if (job is not None and not running.finished and running.queue == d.queue
                        and job.id == current.id and job.lease_epoch == current.lease_epoch
                        and running.session.closed.is_set()):
                    running.held.append(d)
                    return True
        return False

    def _process(self, d: _Delivery, running: _Running
                 ) -> tuple[Job | None, Settlement, str] | None:
        """``(job, settlement, reason)``: what the store now says, and how to settle the
        delivery; None when it is held for the handler already running its job here."""
        decoded = decode(d.body)
        if decoded is None or decoded[0] != d.queue:
            # Never the body in the log: it may be anything, a payload or a secret included.
            log.warning("consumer %s: delivery %d of queue %r (%d bytes) is not a leaseq "
                        "message for this queue, or its job id is not valid; quarantined",
                        self.worker_id, d.tag, d.queue, len(d.body),
                        extra=queue_fields("malformed_message", d.queue))
            return None, Settlement.QUARANTINE, "not a leaseq message for this queue"
        queue = self.queues[d.queue]
        job_id = decoded[1]
        queue.store.append_journal(
            queue.name, job_id, JournalEvent.RECEIVED, worker_id=self.worker_id,
            reason=(f"redelivered (delivery count {d.delivery_count})" if d.redelivered
                    else "first delivery"),
            data={"redelivered": d.redelivered, "delivery_count": d.delivery_count})
        sent_at = time.monotonic()  # the lease clock starts when the claim leaves
        job = queue.claim_one(job_id, self.worker_id)
        if job is None:
            return self._not_claimed(d, queue, job_id)
        if not self._hold(running, job):
            return None, Settlement.REQUEUE, "given back: the consumer is stopping"
        return self._run(job, sent_at)

    def _not_claimed(self, d: _Delivery, queue: Queue, job_id: str
                     ) -> tuple[Job | None, Settlement, str] | None:
        """How to settle a delivery whose job the claim did not take; None when it is held."""
        current = queue.get(job_id)
        if (d.redelivered and current is not None and current.status == JobStatus.PROCESSING
                and current.worker_id == self.worker_id):
            if self._hold_redelivery(d, current):
                log.info("consumer %s: redelivery %d of job %s held unacked: its handler still "
                         "runs here, and the session of its first delivery is gone",
                         self.worker_id, d.tag, current.id[:200],
                         extra=job_fields("redelivery_held", current))
                return None
            current = queue.get(job_id)  # its handler just ended: what did it write?
        if d.redelivered and current is not None and current.status == JobStatus.FAILED:
            # Its last consumer wrote `failed` and went before its nack (or its lease ran out
            # and the reclaim failed it): the message is dead-lettered now, so the quarantine
            # queue holds every failed job's message.
            return current, Settlement.QUARANTINE, "already failed: dead-lettered on redelivery"
        # Held by a live lease (another consumer's, or one abandoned here) is acked too: when
        # that lease lapses the reclaim makes the job owed, and it is published again.
        return current, Settlement.ACK, f"not claimable: {_why_not(current, queue.limits.any)}"

    def _run(self, job: Job, sent_at: float) -> tuple[Job | None, Settlement, str]:
        try:
            after = self._execute(job, sent_at)
        except LeaseLost as exc:
            # Nothing was written and the job is not finished: an ack would settle it without a
            # result. No journal line either: the store is likely what cut this lease off.
            log.warning("consumer %s: job %s not finished here (lease lost); its delivery goes "
                        "back to RabbitMQ", self.worker_id, job.id[:200],
                        extra=job_fields("lease_lost_requeued", job))
            return None, Settlement.REQUEUE, f"lease lost: {exc}"[:500]
        # Only a job that ended in quarantine goes to the dead-letter exchange; a retry is
        # acked, because nack(requeue=False) would dead-letter it too.
        if after.status == JobStatus.FAILED:
            return after, Settlement.QUARANTINE, f"{after.status}: {after.failure}"
        return after, Settlement.ACK, after.status

    def _settle(self, d: _Delivery, job: Job | None, settlement: Settlement,
                reason: str) -> None:
        """Ack / nack on the delivery's own channel, from the connection's thread; then
        journal ``ack_sent`` (only once it really went out)."""
        sent = threading.Event()
        error: list[BaseException] = []

        def send() -> None:
            try:
                if settlement == Settlement.ACK:
                    d.session.channel.basic_ack(d.tag)
                else:
                    d.session.channel.basic_nack(
                        d.tag, requeue=settlement == Settlement.REQUEUE)
            except BaseException as exc:
                error.append(exc)
            sent.set()

        try:
            d.session.conn.add_callback_threadsafe(send)
        except Exception as exc:  # the connection dropped: pika may raise any error here
            error.append(exc)
            sent.set()
        deadline = time.monotonic() + self.config.settle_timeout_s
        while not sent.wait(0.05):
            if d.session.closed.is_set() or time.monotonic() > deadline:
                error.append(TimeoutError("connection closed before the ack was sent"))
                break
        if error:
            log.warning("consumer %s: %s of delivery %d (job %r) not sent (%s); RabbitMQ will "
                        "redeliver it and its claim decides again",
                        self.worker_id, settlement, d.tag,
                        job.id[:200] if job else None,
                        safe_reason(error[0], redact=self.queues[d.queue].redact),
                        extra=job_fields("settle_failed", job) if job
                        else queue_fields("settle_failed", d.queue))
            return
        if job is None:
            return
        try:
            self.queues[d.queue].store.append_journal(
                d.queue, job.id, JournalEvent.ACK_SENT, attempt=job.attempts,
                lease_epoch=job.lease_epoch,
                worker_id=self.worker_id, reason=f"{settlement}; {reason}",
                data={"redelivered": d.redelivered, "nack": settlement != Settlement.ACK})
        except Exception as exc:  # the ack is out; a missing journal line must not drop it
            redact = self.queues[d.queue].redact
            log.error("consumer %s: could not journal ack_sent for job %r (%s)\n%s",
                      self.worker_id, job.id[:200], safe_reason(exc, redact=redact),
                      traceback_text(exc, redact), extra=job_fields("journal_failed", job))


def _why_not(job: Job | None, limited: bool = False) -> str:
    if job is None:
        return "no such job"
    if is_terminal(job.status):
        return f"already {job.status}"
    if job.attempts >= job.max_attempts:
        return "attempts spent"
    if job.status == JobStatus.PROCESSING:
        return "held by a live lease"
    if limited:  # docs/limits.md, "Broker delivery": published again only by a republish
        return "held back by the queue's limits, or not due yet (`leaseq rabbitmq republish`)"
    return "not due yet"
