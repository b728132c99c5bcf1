"""The outbox dispatcher: publishes what the store owes RabbitMQ, marks it only after the confirm.

The store is the outbox: a ``pending`` job that is due and has no ``published_at`` is owed one
publish (every transition to ``pending`` clears the mark). Per queue the loop is: read a batch of
owed jobs, publish each with ``mandatory`` and publisher confirms, then mark the confirmed ones
in one transaction. A crash between confirm and mark leaves them owed, so they are published a
second time; the consumer's claim makes that second delivery harmless. Before its first round
the dispatcher has each store prepare that read (``Store.prepare_outbox``: PostgreSQL builds
the outbox's index then, so a schema without a dispatcher never pays for it).

A message RabbitMQ dead-letters at its delivery limit (returned unsettled too often: consumers
that lost their connection or their store) is no verdict on its job. The topology routes those
into ``P.Q.delivery-limit``; each round the dispatcher reads them, owes a new publish for each
job still ``pending`` with its publish marked (``reowe_publish``, journaled ``publish_owed``),
and only then acks them. A job in any other state needs nothing: it was settled, or is held by
a lease whose expiry (reclaim) owes its publish anyway. Quarantined messages (``rejected``) go
to ``P.Q.quarantine`` and are never read here.

Several dispatchers may run. Per leaseq queue only the holder of an *exclusive* RabbitMQ queue
(``P.Q.dispatcher``) publishes; the broker drops it with its owner's connection, so a standby
takes over within a heartbeat. Double publishes are therefore limited to the crash window.

A dispatcher given a store to follow (``discover``: ``leaseq dispatch`` without ``--queue``)
reads the store's queues again every ``discover_every_s`` and serves each new one as it serves
the first: topology declared (or checked), then its lock taken. Without that, a queue whose
first job came after the start was owed publishes nobody made.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from leaseq import validate
from leaseq.delivery.connection import (
    CONTENT_TYPE,
    decode,
    encode,
    message_id,
    reconnecting,
    session,
)
from leaseq.delivery.topology import Topology
from leaseq.errors import InvalidInput, StoreUnavailable
from leaseq.job import newest_change, safe_reason
from leaseq.journal import JournalEvent
from leaseq.redact import combined, traceback_text

if TYPE_CHECKING:
    from pika import BlockingConnection
    from pika.adapters.blocking_connection import BlockingChannel

    from leaseq.job import Job
    from leaseq.queue import Queue
    from leaseq.stores.base import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DispatcherConfig:
    """How a dispatcher polls and publishes. Validated when built."""

    batch_size: int = 100
    """Owed jobs read, published and marked per round. Defaults to 100."""
    poll_interval_s: float = 1.0
    """Longest wait for work when nothing is owed (an enqueue in this process, or a store with
    push wake-ups, ends it early). Defaults to 1 s."""
    reclaim_every_s: float = 30.0
    """How often expired leases are reclaimed (the outbox only sees ``pending`` jobs, so a
    crashed consumer's job is owed again only after reclaim). 0 turns it off. Defaults to 30 s."""
    retry_publish_s: float = 2.0
    """Wait after a message was returned (unroutable) or nacked before trying again.
    Defaults to 2 s."""
    max_backoff_s: float = 10.0
    """Longest wait between reconnects to RabbitMQ. Defaults to 10 s."""
    discover_every_s: float = 5.0
    """How often a dispatcher that follows a store (``discover``) reads the store's queues
    again, to serve the ones that got their first job since (one walk of the queue index per
    read). Defaults to 5 s."""

    def __post_init__(self) -> None:
        validate.batch_size(self.batch_size, "batch_size")
        for name in ("poll_interval_s", "reclaim_every_s", "retry_publish_s", "max_backoff_s",
                     "discover_every_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise InvalidInput(f"{name} must be a number of seconds ≥ 0, got {value!r}")


@dataclass(slots=True)
class _Round:
    """What one publishing round did, for the loop's decision and for logs."""

    published: int = 0
    marked: int = 0
    refused: list[str] = field(default_factory=list)


class Dispatcher:
    """Publishes the outbox of ``queues`` to RabbitMQ until ``stop`` is set; with ``discover``,
    also of each queue that store holds later."""

    def __init__(self, queues: Sequence[Queue], amqp_url: str, *,
                 topology: Topology | None = None, config: DispatcherConfig | None = None,
                 declare: bool = True, discover: Store | None = None):
        if not queues:
            raise InvalidInput("a dispatcher needs at least one queue")
        self.queues = list(queues)
        self.discover = discover
        """The store whose queues are read again every ``discover_every_s``; None: only
        ``queues``."""
        self._next_discovery = 0.0
        self.amqp_url = amqp_url
        self.topology = topology or Topology()
        self.config = config or DispatcherConfig()
        self.declare = declare
        self._warned: set[str] = set()
        """Holding queues whose default delivery limit was logged (once per start)."""
        self.redact = combined(q.redact for q in self.queues)
        """Masks the errors the dispatcher logs: every queue's redactor (its app's)."""
        self._next_reclaim = 0.0
        #: Each store once (several queues may share one), until its outbox is prepared.
        self._unprepared = list({id(q.store): q.store for q in self.queues}.values())

    def run(self, stop: threading.Event) -> None:
        """Publish until ``stop`` is set, reconnecting after whatever a lost connection or a
        store outage raises. ``TopologyError`` is raised at once: a missing dead-letter route
        is an operator's job to fix."""
        reconnecting(lambda: self._session(stop), stop, "dispatcher",
                     self.config.max_backoff_s, self.redact)

    def _session(self, stop: threading.Event) -> None:
        self._prepare_outboxes(stop)
        with session(self.amqp_url, "leaseq-dispatcher") as conn:
            self._ensure_topology(conn)
            channel = conn.channel()
            channel.confirm_delivery()
            dead_letters = conn.channel()
            leading: set[str] = set()
            while not stop.is_set():
                self._discover_if_due(conn)
                leading |= self._acquire_locks(conn, leading)
                mine = [q for q in self.queues if q.name in leading]
                for queue in mine:
                    self.reowe_dead_letters(dead_letters, queue)
                rounds = [self.run_once(channel, q) for q in mine]
                self._reclaim_if_due()
                if any(r.refused for r in rounds):
                    pause(conn, stop, self.config.retry_publish_s)
                    self._ensure_topology(conn)  # an unroutable message: maybe a lost binding
                elif not any(r.published == self.config.batch_size for r in rounds):
                    self._idle(conn, stop)

    def _prepare_outboxes(self, stop: threading.Event) -> None:
        """``prepare_outbox`` on each store, once, before the first ``outbox_due`` (on
        PostgreSQL it builds the outbox's index, which only a dispatcher needs). Before the
        broker's connection opens: nothing would answer its heartbeats during a long build.
        A store outage is raised, so the session is tried again; any other failure is logged
        and the dispatcher goes on without: the index makes ``outbox_due`` fast, not right."""
        while self._unprepared:
            store = self._unprepared[0]
            try:
                store.prepare_outbox(stop)
                if stop.is_set():
                    return  # prepared or not: the next start prepares what is left
            except StoreUnavailable:
                raise
            except Exception as exc:  # the traceback says where; redacted like the reason
                log.warning("dispatcher: could not prepare the outbox of store %s (%s); "
                            "publishing without it (each round then walks every published job "
                            "still waiting for a consumer)\n%s", store.url,
                            safe_reason(exc, redact=self.redact),
                            traceback_text(exc, self.redact))
            self._unprepared.pop(0)

    def _ensure_topology(self, conn: BlockingConnection,
                         queues: Sequence[Queue] | None = None) -> None:
        names = [q.name for q in (self.queues if queues is None else queues)]
        self.topology.ensure(conn, names, declare=self.declare, warned=self._warned)

    def _discover_if_due(self, conn: BlockingConnection) -> None:
        """Serve the queues ``discover`` holds that this dispatcher does not serve yet: their
        topology first (a publish before it would be returned unroutable), then the loop takes
        their locks. Their stores are those already prepared (``discover`` is one of them)."""
        if self.discover is None or time.monotonic() < self._next_discovery:
            return
        self._next_discovery = time.monotonic() + self.config.discover_every_s
        known = {q.name for q in self.queues}
        new = [self.discover.queue(name) for name in self.discover.queues() if name not in known]
        if not new:
            return
        self._ensure_topology(conn, new)
        self.queues.extend(new)
        self.redact = combined(q.redact for q in self.queues)
        for queue in new:
            log.info("dispatcher: queue %r is new in the store; serving it", queue.name)

    def _acquire_locks(self, conn: BlockingConnection, held: set[str]) -> set[str]:
        """The queues whose dispatcher lock this connection newly took (a 405 when another
        dispatcher's connection holds it)."""
        from pika.exceptions import ChannelClosedByBroker

        taken = set()
        for queue in self.queues:
            if queue.name in held:
                continue
            channel = conn.channel()
            try:
                channel.queue_declare(self.topology.dispatcher_lock(queue.name),
                                      exclusive=True, auto_delete=True)
            except ChannelClosedByBroker as exc:
                if exc.reply_code != 405:
                    raise
                continue
            channel.close()
            log.info("dispatcher: publishing the outbox of queue %r", queue.name)
            taken.add(queue.name)
        return taken

    def _idle(self, conn: BlockingConnection, stop: threading.Event) -> None:
        """Wait for work while keeping the connection's heartbeats answered."""
        deadline = time.monotonic() + self.config.poll_interval_s
        names = [q.name for q in self.queues]
        store = self.queues[0].store
        while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
            conn.process_data_events(time_limit=0)
            if store.wait_for_work(names, min(left, 0.25)):
                return

    def _reclaim_if_due(self) -> None:
        every = self.config.reclaim_every_s
        if not every or time.monotonic() < self._next_reclaim:
            return
        self._next_reclaim = time.monotonic() + every
        for queue in self.queues:
            failed, returned = queue.reclaim_expired()
            if failed or returned:
                log.info("dispatcher: queue %r: %d expired leases made ready, %d quarantined",
                         queue.name, returned, failed)

    def reowe_dead_letters(self, channel: BlockingChannel, queue: Queue) -> int:
        """Read a batch of ``queue``'s messages dead-lettered at the delivery limit, owe
        their jobs a new publish, then ack them. Returns how many jobs are owed again.

        The ack comes after the store's write: a crash or a store error in between returns
        the messages (the connection closes), and reading them again owes nothing twice."""
        ids, last_tag = self._take_dead_letters(channel, queue)
        if last_tag is None:
            return 0
        owed = queue.store.reowe_publish(queue.name, ids) if ids else []
        channel.basic_ack(last_tag, multiple=True)
        if owed:
            log.info("dispatcher: queue %r: %d job(s) owed a new publish (their message was "
                     "dead-lettered at the delivery limit)", queue.name, len(owed))
        return len(owed)

    def _take_dead_letters(self, channel: BlockingChannel, queue: Queue
                           ) -> tuple[list[str], int | None]:
        """The job ids of up to ``batch_size`` delivery-limit dead letters (unacked), and the
        last delivery tag (None when there was none)."""
        name = self.topology.delivery_limit_queue(queue.name)
        ids: dict[str, None] = {}
        last_tag = None
        for _ in range(self.config.batch_size):
            method, _props, body = channel.basic_get(name, auto_ack=False)
            if method is None or body is None:
                break  # pika gives both or neither
            last_tag = method.delivery_tag
            decoded = decode(body)
            if decoded is None or decoded[0] != queue.name:
                log.warning("dispatcher: dropped a message from %r that is no job of queue %r",
                            name, queue.name)
                continue
            ids[decoded[1]] = None
        return list(ids), last_tag

    def run_once(self, channel: BlockingChannel, queue: Queue) -> _Round:
        """Publish one batch of ``queue``'s owed jobs and mark the confirmed ones."""
        done = _Round()
        confirmed: list[Job] = []
        try:
            for job in queue.outbox_due(self.config.batch_size):
                if self._publish(channel, queue, job):
                    confirmed.append(job)
                else:
                    done.refused.append(job.id)
        except BaseException:
            # The session is lost, but what the broker confirmed before is not owed again:
            # unmarked, it would be published anew at every reconnect
            if confirmed:
                self._mark(queue, confirmed)
            raise
        done.published = len(confirmed) + len(done.refused)
        # Only after every confirm: a crash before this line means "publish again", never
        # "marked but never reached the broker".
        done.marked = self._mark(queue, confirmed) if confirmed else 0
        return done

    def _mark(self, queue: Queue, confirmed: list[Job]) -> int:
        """Mark the ``confirmed`` jobs published; returns how many were still owed."""
        marked = set(queue.store.mark_published(queue.name, [j.lease for j in confirmed],
                                                as_of=newest_change(confirmed)))
        self._journal_moved_on(queue, [j for j in confirmed if j.id not in marked])
        return len(marked)

    @staticmethod
    def _journal_moved_on(queue: Queue, unmarked: list[Job]) -> None:
        """``mark_published`` marks (and journals) only jobs still in the state that was
        published; a consumer may have taken a job (and even given it back) before its confirm
        came back. Journal those publishes here, so every job's story shows each publish the
        broker confirmed."""
        for sent in unmarked:
            job = queue.get(sent.id)
            if job is None:
                continue  # purged meanwhile: no story left to tell
            if (job.status == "pending" and job.lease_epoch == sent.lease_epoch
                    and job.published_at is not None):
                continue  # marked after all: a retried mark whose first try's answer was lost
            queue.store.append_journal(
                queue.name, sent.id, JournalEvent.PUBLISHED, attempt=sent.attempts,
                lease_epoch=sent.lease_epoch,
                reason=f"confirmed after the job moved on (now {job.status}, "
                       f"epoch {job.lease_epoch})")

    def _publish(self, channel: BlockingChannel, queue: Queue, job: Job) -> bool:
        """True once the broker confirmed it; False when it was returned or nacked (the job
        stays owed and is tried again)."""
        import pika
        from pika.exceptions import NackError, UnroutableError

        props = pika.BasicProperties(
            delivery_mode=pika.DeliveryMode.Persistent, content_type=CONTENT_TYPE,
            message_id=message_id(job.id), type="leaseq.job",
            headers={"leaseq-queue": queue.name, "leaseq-attempts": job.attempts})
        try:
            channel.basic_publish(self.topology.exchange, queue.name, encode(queue.name, job.id),
                                  props, mandatory=True)
        except UnroutableError:
            log.error("dispatcher: job %r of queue %r was returned unroutable: exchange %r has "
                      "no binding for key %r (see docs/rabbitmq.md, 'job queued for long')",
                      job.id[:200], queue.name, self.topology.exchange, queue.name)
            return False
        except NackError:
            log.warning("dispatcher: RabbitMQ nacked job %r of queue %r; will publish again",
                        job.id[:200], queue.name)
            return False
        return True


def pause(conn: BlockingConnection, stop: threading.Event, seconds: float) -> None:
    """Wait ``seconds``, or until ``stop``, answering the connection's heartbeats meanwhile:
    a bare wait longer than the broker's heartbeat timeout lost the connection, and with it
    the dispatcher locks."""
    until = time.monotonic() + seconds
    while not stop.is_set() and (left := until - time.monotonic()) > 0:
        conn.process_data_events(time_limit=min(left, 0.25))
