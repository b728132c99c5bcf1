"""The consumer: a delivery is a wake-up for one job id; the store decides what happens.

Per delivery, in this order (the order is the guarantee):

1. journal ``received`` (redelivered flag, delivery count);
2. ``claim_one`` that job, noting when the claim was sent (the job's lease clock starts then).
   Not claimable (terminal, not due, held by a live lease, unknown) → ack, no effect: the store
   said so, and a job held by a lease is owed its publish again when that lease lapses (reclaim);
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
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from leaseq.delivery.connection import Reconnect, amqp_errors, decode, reconnecting, session
from leaseq.delivery.topology import Topology
from leaseq.errors import InvalidInput
from leaseq.job import Job, JobStatus, LeaseLost, is_terminal, safe_reason
from leaseq.journal import JournalEvent
from leaseq.logfields import job_fields, queue_fields
from leaseq.redact import combined, traceback_text

if TYPE_CHECKING:
    from pika import BlockingConnection
    from pika.adapters.blocking_connection import BlockingChannel

    from leaseq.queue import Queue

log = logging.getLogger(__name__)

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
    """On stop, how long in-flight jobs may run on before the connection closes.
    Defaults to 30 s."""
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
        self.redact = combined(q.redact for q in queues)
        """Masks the errors the consumer logs about its connection: every queue's redactor
        (``Queue.redact``, its app's); a delivery's own errors get its queue's."""
        self._busy = 0
        self._lock = threading.Lock()

    # --- the connection's thread -----------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Consume until ``stop`` is set, reconnecting after whatever a lost connection or a
        store outage raises; then let in-flight jobs finish within ``grace_s``.
        ``TopologyError`` (and any other refusal of leaseq's own) is raised at once."""
        with ThreadPoolExecutor(self.config.concurrency, "leaseq-consumer") as pool:
            reconnecting(lambda: self._session(pool, stop), stop, "consumer",
                         self.config.max_backoff_s, self.redact)

    def _session(self, pool: ThreadPoolExecutor, stop: threading.Event) -> None:
        with session(self.amqp_url, f"leaseq-consumer {self.worker_id}") as conn:
            for name in self.queues:
                check = self.topology.declare if self.declare else self.topology.verify
                check(conn.channel, name)
            channel = conn.channel()
            channel.basic_qos(prefetch_count=self.config.concurrency)
            state = _Session(conn, channel, threading.Event())
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

    def _drain(self, state: _Session) -> None:
        """Stop taking deliveries; keep sending acks while in-flight jobs finish."""
        for tag in list(state.channel.consumer_tags):
            state.channel.basic_cancel(tag)
        deadline = time.monotonic() + self.config.grace_s
        while self._busy and time.monotonic() < deadline:
            state.conn.process_data_events(time_limit=0.1)
        if self._busy:
            log.warning("consumer %s: %d jobs still running after the grace period; their "
                        "messages return to RabbitMQ and their leases expire", self.worker_id,
                        self._busy, extra=queue_fields("grace_expired"))

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
        with self._lock:
            self._busy += 1
        pool.submit(self._handle, delivery)

    # --- handler threads -------------------------------------------------------------------

    def _handle(self, d: _Delivery) -> None:
        try:
            job, settlement, reason = self._process(d)
            self._settle(d, job, settlement, reason)
        except BaseException as exc:  # a store error: the message must come back, unacked
            redact = self.queues[d.queue].redact
            log.error("consumer %s: delivery %d of queue %r not settled (%s); reconnecting so "
                      "RabbitMQ returns it\n%s", self.worker_id, d.tag, d.queue,
                      safe_reason(exc, redact=redact), traceback_text(exc, redact),
                      extra=queue_fields("unsettled", d.queue))
            d.session.broken = (exc if isinstance(exc, amqp_errors())
                                else Reconnect(safe_reason(exc, redact=redact)))
        finally:
            with self._lock:
                self._busy -= 1

    def _process(self, d: _Delivery) -> tuple[Job | None, Settlement, str]:
        """``(job, settlement, reason)``: what the store now says, and how to settle the
        delivery."""
        decoded = decode(d.body)
        if decoded is None or decoded[0] != d.queue:
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
            # Held by a live lease (another consumer's, or one abandoned here) is acked too:
            # when that lease lapses the reclaim makes the job owed, and it is published again.
            current = queue.get(job_id)
            return current, Settlement.ACK, f"not claimable: {_why_not(current)}"
        return self._run(job, sent_at)

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


def _why_not(job: Job | None) -> str:
    if job is None:
        return "no such job"
    if is_terminal(job.status):
        return f"already {job.status}"
    if job.attempts >= job.max_attempts:
        return "attempts spent"
    if job.status == JobStatus.PROCESSING:
        return "held by a live lease"
    return "not due yet"
