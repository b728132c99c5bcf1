"""RabbitMQ topology for leaseq: names, arguments, an idempotent declare and a start-up check.

Per leaseq queue ``Q`` and prefix ``P`` (default ``leaseq``):

* exchange ``P`` (direct, durable): the dispatcher publishes here with routing key ``Q``;
* queue ``P.Q`` (quorum, durable), bound to ``P`` with key ``Q``; its dead-letter exchange is
  ``P.dlx`` with key ``Q``, dead-lettering is ``at-least-once`` (so a quarantined message
  cannot be dropped between the two queues) and ``x-delivery-limit`` is the backstop against a
  message that kills every consumer it reaches;
* exchange ``P.dlx`` (direct, durable), bound by key ``Q`` to exchange ``P.dlx.reason``
  (headers, durable), which sorts ``P.Q``'s dead letters by ``x-first-death-reason``:
  ``rejected`` (and ``expired``, ``maxlen``) into queue ``P.Q.quarantine``, where
  ``nack(requeue=False)`` puts a quarantined job's message; ``delivery_limit`` into queue
  ``P.Q.delivery-limit``, which the dispatcher reads to owe those jobs a new publish (a
  message returned too often is no verdict on its job: a store outage returns every message
  a consumer holds). Both queues are quorum, durable, and hold messages that are read and
  returned (a peek, a dispatcher round that fails): from RabbitMQ 4.0 they are declared with
  no delivery limit (``holding_arguments``), since 4.0's default of 20 would drop a message
  returned that often (they have no dead-letter exchange).

A dead-letter route that is missing, or a queue declared earlier with other arguments, would
silently turn every quarantine into a lost message; so both are refused at start-up with
``TopologyError`` rather than repaired behind the operator's back. One exception: a holding
queue declared before without a delivery limit, on RabbitMQ 4, is used as it is with a warning
(refusing it would stop every deployment at the broker's upgrade).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leaseq import validate
from leaseq.delivery.connection import broker_version
from leaseq.errors import InvalidInput, TopologyError
from leaseq.logfields import queue_fields

if TYPE_CHECKING:
    from pika import BlockingConnection
    from pika.adapters.blocking_connection import BlockingChannel
    from pika.exceptions import ChannelClosedByBroker

log = logging.getLogger(__name__)

#: A channel opener: a fresh channel per check, because a failed declare closes its channel.
ChannelFactory = Callable[[], "BlockingChannel"]

#: RabbitMQ's ``x-death`` reason when a quorum queue dead-letters a message returned more than
#: ``x-delivery-limit`` times: no verdict on the job, whose publish the dispatcher owes again.
DELIVERY_LIMIT = "delivery_limit"
#: Every other reason RabbitMQ dead-letters for: ``rejected`` is leaseq's quarantine (a nack
#: after ``failed`` was written); ``expired`` and ``maxlen`` come only from an operator's
#: policy (TTL, length limit) and are kept for a person to look at.
QUARANTINE_REASONS = ("rejected", "expired", "maxlen")

#: A RabbitMQ version as numbers, ``(3, 10, 8)``; ``()`` when the broker did not say (taken for
#: 3.x: the arguments every version accepts). ``connection.broker_version`` reads it.
BrokerVersion = tuple[int, ...]
#: From RabbitMQ 4.0 a quorum queue declared without ``x-delivery-limit`` has a limit of
#: ``RABBITMQ_DEFAULT_DELIVERY_LIMIT`` all the same; ``-1`` (``UNLIMITED``) lifts it. Before
#: 4.0 a negative limit reads as 0, a message dropped at its first return: so it is given only
#: from this version on.
DEFAULT_LIMIT_FROM: BrokerVersion = (4,)
RABBITMQ_DEFAULT_DELIVERY_LIMIT = 20
UNLIMITED = -1


@dataclass(frozen=True, slots=True)
class Topology:
    """Names and arguments of leaseq's exchanges and queues on one broker (vhost)."""

    prefix: str = "leaseq"
    """First part of every exchange and queue name. Defaults to ``leaseq``."""
    delivery_limit: int = 20
    """Returns of one message to its queue (consumer crashes, lost connections, and a
    consumer's requeue of a job whose lease it lost) before it is dead-lettered into
    ``P.Q.delivery-limit``. Defaults to 20."""

    def __post_init__(self) -> None:
        validate.queue_name(self.prefix)
        limit = self.delivery_limit
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise InvalidInput(f"delivery_limit must be a whole number from 1 to 10000, "
                               f"got {limit!r}")

    # --- names -----------------------------------------------------------------------------

    @property
    def exchange(self) -> str:
        return self.prefix

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.prefix}.dlx"

    def work_queue(self, queue: str) -> str:
        return f"{self.prefix}.{queue}"

    @property
    def reason_exchange(self) -> str:
        return f"{self.prefix}.dlx.reason"

    def quarantine_queue(self, queue: str) -> str:
        return f"{self.prefix}.{queue}.quarantine"

    def delivery_limit_queue(self, queue: str) -> str:
        return f"{self.prefix}.{queue}.delivery-limit"

    def dispatcher_lock(self, queue: str) -> str:
        return f"{self.prefix}.{queue}.dispatcher"

    def work_arguments(self, queue: str) -> dict[str, Any]:
        return {
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": self.dead_letter_exchange,
            "x-dead-letter-routing-key": queue,
            # at-least-once dead-lettering needs reject-publish; without it RabbitMQ falls
            # back to at-most-once and a quarantined message may vanish on the way.
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
            "x-delivery-limit": self.delivery_limit,
        }

    @staticmethod
    def holding_arguments(broker: BrokerVersion) -> dict[str, Any]:
        """Arguments of ``P.Q.quarantine`` and ``P.Q.delivery-limit`` on a broker of version
        ``broker``: quorum, and from ``DEFAULT_LIMIT_FROM`` on no delivery limit."""
        if broker >= DEFAULT_LIMIT_FROM:
            return {"x-queue-type": "quorum", "x-delivery-limit": UNLIMITED}
        return {"x-queue-type": "quorum"}

    def holding_queues(self, queue: str) -> tuple[str, str]:
        return self.quarantine_queue(queue), self.delivery_limit_queue(queue)

    def limit_warning(self, queue: str, name: str) -> str:
        """What to tell the operator about holding queue ``name`` of ``queue`` when it has
        RabbitMQ 4's default delivery limit."""
        again = f"leaseq rabbitmq topology --queue {queue}"
        if self.prefix != "leaseq":
            again += f" --prefix {self.prefix}"
        return (f"RabbitMQ queue {name!r} was declared without x-delivery-limit (by an older "
                f"leaseq, or under RabbitMQ 3.x), so RabbitMQ 4's default delivery limit of "
                f"{RABBITMQ_DEFAULT_DELIVERY_LIMIT} applies to it: a message returned to it "
                f"{RABBITMQ_DEFAULT_DELIVERY_LIMIT} times (peeks, failed dispatcher rounds) is "
                f"dropped. leaseq goes on with the queue as it is. To lift the limit, drain it, "
                f"delete it, and run `{again}`: it declares it again with x-delivery-limit "
                f"{UNLIMITED} (docs/rabbitmq.md, Topology).")

    def reason_binding(self, queue: str, reason: str) -> dict[str, Any]:
        """Binding arguments on ``reason_exchange`` for ``queue``'s dead letters of ``reason``
        (``all-with-x``: RabbitMQ ≥ 3.10 matches ``x-`` headers only when asked to)."""
        return {"x-match": "all-with-x", "x-first-death-reason": reason,
                "x-first-death-queue": self.work_queue(queue)}

    def dead_letter_routes(self, queue: str) -> list[tuple[str, str]]:
        """``(queue name, reason)``: where each dead-letter reason of ``queue`` goes."""
        return [*((self.quarantine_queue(queue), r) for r in QUARANTINE_REASONS),
                (self.delivery_limit_queue(queue), DELIVERY_LIMIT)]

    # --- declare and check -----------------------------------------------------------------

    def ensure(self, conn: BlockingConnection, queues: Iterable[str], *, declare: bool,
               warned: set[str]) -> list[tuple[str, str]]:
        """``declare`` (or with ``declare=False`` only ``verify``) the topology of ``queues``
        on ``conn``, for the broker's version its handshake gave. Returns ``(queue, holding
        queue)`` for each holding queue left with RabbitMQ 4's default delivery limit; each
        is logged (a WARNING) once, unless already in ``warned``, which it joins: a
        reconnecting process passes the same set to every session."""
        broker = broker_version(conn)
        check = self.declare if declare else self.verify
        limited = [(queue, name) for queue in queues
                   for name in check(conn.channel, queue, broker=broker)]
        for queue, name in limited:
            if name not in warned:
                warned.add(name)
                log.warning("%s", self.limit_warning(queue, name),
                            extra=queue_fields("holding_queue_limited", queue))
        return limited

    def declare(self, channel: ChannelFactory, queue: str, *,
                broker: BrokerVersion) -> list[str]:
        """Declare everything ``queue`` needs on a broker of version ``broker``
        (idempotent), then ``verify`` it; returns what ``verify`` returns.

        Raises ``TopologyError`` when something exists with other arguments (406)."""
        exchanges = ((self.exchange, "direct"), (self.dead_letter_exchange, "direct"),
                     (self.reason_exchange, "headers"))
        for name, kind in exchanges:
            _checked(channel, f"exchange {name!r}",
                     lambda ch, n=name, k=kind: ch.exchange_declare(n, k, durable=True))
        for name in self.holding_queues(queue):
            self._declare_holding_queue(channel, name, broker)
        self._declare_queue(channel, self.work_queue(queue), self.work_arguments(queue))
        self._declare_dead_letter_routes(channel, queue)
        _checked(channel, f"binding {self.exchange!r} → {self.work_queue(queue)!r}",
                 lambda ch: ch.queue_bind(
            self.work_queue(queue), self.exchange, routing_key=queue))
        return self.verify(channel, queue, broker=broker)

    def _declare_dead_letter_routes(self, channel: ChannelFactory, queue: str) -> None:
        """Route ``queue``'s dead letters by reason. The sorted routes exist before the
        direct binding earlier versions made (``P.dlx`` → ``P.Q.quarantine``, which would
        copy delivery-limit dead letters into the quarantine) is removed, so every dead
        letter has a route at every moment of an upgrade."""
        for name, reason in self.dead_letter_routes(queue):
            _checked(channel, f"binding {self.reason_exchange!r} → {name!r} ({reason})",
                     lambda ch, n=name, r=reason: ch.queue_bind(
                         n, self.reason_exchange, arguments=self.reason_binding(queue, r)))
        _checked(channel, f"binding {self.dead_letter_exchange!r} → {self.reason_exchange!r}",
                 lambda ch: ch.exchange_bind(self.reason_exchange, self.dead_letter_exchange,
                                             routing_key=queue))
        _checked(channel, f"old binding {self.dead_letter_exchange!r} → "
                 f"{self.quarantine_queue(queue)!r}", lambda ch: ch.queue_unbind(
            self.quarantine_queue(queue), self.dead_letter_exchange, routing_key=queue))

    def verify(self, channel: ChannelFactory, queue: str, *,
               broker: BrokerVersion) -> list[str]:
        """Check, without creating anything, that ``queue``'s route and dead-letter route exist
        with leaseq's arguments for a broker of version ``broker``. Raises ``TopologyError``
        saying what is wrong and what to do. Returns the holding queues that have all of them
        but the delivery limit (``_declare_holding_queue``); empty before RabbitMQ 4.

        Passive declares prove existence; an active declare of an existing queue with the
        same arguments changes nothing and answers 406 when its arguments differ."""
        for name in (self.exchange, self.dead_letter_exchange, self.reason_exchange):
            _checked(channel, f"exchange {name!r}",
                     lambda ch, n=name: ch.exchange_declare(n, passive=True))
        for name in (self.work_queue(queue), *self.holding_queues(queue)):
            _checked(channel, f"queue {name!r}",
                     lambda ch, n=name: ch.queue_declare(n, passive=True))
        self._declare_queue(channel, self.work_queue(queue), self.work_arguments(queue))
        return [name for name in self.holding_queues(queue)
                if not self._declare_holding_queue(channel, name, broker)]

    def _declare_holding_queue(self, channel: ChannelFactory, name: str,
                               broker: BrokerVersion) -> bool:
        """Declare holding queue ``name`` with ``holding_arguments(broker)``: True. False when
        it exists without a delivery limit (``lacks_delivery_limit``), declared by an older
        leaseq or under RabbitMQ 3.x: it is then checked with the arguments it was given,
        and kept, since a queue's arguments change only by deleting it."""
        args = self.holding_arguments(broker)
        if _checked(channel, f"queue {name!r}",
                    lambda ch: ch.queue_declare(name, durable=True, arguments=args),
                    tolerate=lacks_delivery_limit):
            return True
        self._declare_queue(channel, name, self.holding_arguments(()))
        return False

    @staticmethod
    def _declare_queue(channel: ChannelFactory, name: str, args: dict[str, Any]) -> None:
        _checked(channel, f"queue {name!r}",
                 lambda ch: ch.queue_declare(name, durable=True, arguments=args))


def lacks_delivery_limit(exc: ChannelClosedByBroker) -> bool:
    """Whether the broker refused a declare because the queue exists without the
    ``x-delivery-limit`` asked for (RabbitMQ: "inequivalent arg 'x-delivery-limit' …
    current is none"), and for nothing else: it names the first argument that differs."""
    text = exc.reply_text or ""
    return (exc.reply_code == 406 and "inequivalent arg 'x-delivery-limit'" in text
            and text.endswith("current is none"))


# ``declare`` is called with the channel alone; ``Callable[..., Any]`` lets the lambdas bind
# their loop variables as defaults.
#: The broker's refusals a new session would meet again: no such thing (404), other arguments
#: (406), no access (403). Any other (541 INTERNAL_ERROR in a cluster's hiccup, say) is the
#: broker's passing trouble: it ends the session, and the caller connects again.
REFUSALS = frozenset({403, 404, 406})


def _checked(channel: ChannelFactory, what: str, declare: Callable[..., Any], *,
             tolerate: Callable[[ChannelClosedByBroker], bool] = lambda _exc: False) -> bool:
    """Run one declare on a fresh channel: True when it passed, False when the broker refused
    it in a way ``tolerate`` accepts; any other refusal (``REFUSALS``) is ``TopologyError``."""
    from pika.exceptions import ChannelClosedByBroker

    ch = channel()
    try:
        declare(ch)
    except ChannelClosedByBroker as exc:
        if tolerate(exc):
            return False
        if exc.reply_code not in REFUSALS:
            raise  # an AMQPError: a reconnecting loop starts a new session
        raise TopologyError(_explain(what, exc.reply_code, exc.reply_text)) from None
    if ch.is_open:
        ch.close()
    return True


def _explain(what: str, code: int, text: str) -> str:
    if code == 404:
        return (f"RabbitMQ has no {what} ({text}). leaseq refuses to run without its "
                "dead-letter route: run `leaseq rabbitmq topology` (it declares them) or "
                "declare it as docs/rabbitmq.md shows.")
    if code == 406:
        return (f"RabbitMQ already has {what} with other arguments ({text}). leaseq refuses "
                "to run on it: a queue without leaseq's dead-letter arguments would drop "
                "quarantined messages. Delete it (after draining it) or use another --prefix.")
    if code == 403:
        return f"RabbitMQ refused access to {what} ({text}); check the user's permissions."
    return f"RabbitMQ refused {what}: {code} {text}"
