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
  a consumer holds). Both queues are quorum, durable.

A dead-letter route that is missing, or a queue declared earlier with other arguments, would
silently turn every quarantine into a lost message; so both are refused at start-up with
``TopologyError`` rather than repaired behind the operator's back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leaseq import validate
from leaseq.errors import InvalidInput, TopologyError

if TYPE_CHECKING:
    from pika.adapters.blocking_connection import BlockingChannel

#: A channel opener: a fresh channel per check, because a failed declare closes its channel.
ChannelFactory = Callable[[], "BlockingChannel"]

#: RabbitMQ's ``x-death`` reason when a quorum queue dead-letters a message returned more than
#: ``x-delivery-limit`` times: no verdict on the job, whose publish the dispatcher owes again.
DELIVERY_LIMIT = "delivery_limit"
#: Every other reason RabbitMQ dead-letters for: ``rejected`` is leaseq's quarantine (a nack
#: after ``failed`` was written); ``expired`` and ``maxlen`` come only from an operator's
#: policy (TTL, length limit) and are kept for a person to look at.
QUARANTINE_REASONS = ("rejected", "expired", "maxlen")


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
    def quarantine_arguments() -> dict[str, Any]:
        return {"x-queue-type": "quorum"}

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

    def declare(self, channel: ChannelFactory, queue: str) -> None:
        """Declare everything ``queue`` needs (idempotent), then ``verify`` it.

        Raises ``TopologyError`` when something exists with other arguments (406)."""
        exchanges = ((self.exchange, "direct"), (self.dead_letter_exchange, "direct"),
                     (self.reason_exchange, "headers"))
        for name, kind in exchanges:
            _checked(channel, f"exchange {name!r}",
                     lambda ch, n=name, k=kind: ch.exchange_declare(n, k, durable=True))
        for name in (self.quarantine_queue(queue), self.delivery_limit_queue(queue)):
            self._declare_queue(channel, name, self.quarantine_arguments())
        self._declare_queue(channel, self.work_queue(queue), self.work_arguments(queue))
        self._declare_dead_letter_routes(channel, queue)
        _checked(channel, f"binding {self.exchange!r} → {self.work_queue(queue)!r}",
                 lambda ch: ch.queue_bind(
            self.work_queue(queue), self.exchange, routing_key=queue))
        self.verify(channel, queue)

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

    def verify(self, channel: ChannelFactory, queue: str) -> None:
        """Check, without creating anything, that ``queue``'s route and dead-letter route exist
        with leaseq's arguments. Raises ``TopologyError`` saying what is wrong and what to do.

        Passive declares prove existence; an active declare of an existing queue with the
        same arguments changes nothing and answers 406 when its arguments differ."""
        for name in (self.exchange, self.dead_letter_exchange, self.reason_exchange):
            _checked(channel, f"exchange {name!r}",
                     lambda ch, n=name: ch.exchange_declare(n, passive=True))
        for name, args in ((self.work_queue(queue), self.work_arguments(queue)),
                           (self.quarantine_queue(queue), self.quarantine_arguments()),
                           (self.delivery_limit_queue(queue), self.quarantine_arguments())):
            _checked(channel, f"queue {name!r}",
                     lambda ch, n=name: ch.queue_declare(n, passive=True))
            self._declare_queue(channel, name, args)

    @staticmethod
    def _declare_queue(channel: ChannelFactory, name: str, args: dict[str, Any]) -> None:
        _checked(channel, f"queue {name!r}",
                 lambda ch: ch.queue_declare(name, durable=True, arguments=args))


# ``declare`` is called with the channel alone; ``Callable[..., Any]`` lets the lambdas bind
# their loop variables as defaults.
#: The broker's refusals a new session would meet again: no such thing (404), other arguments
#: (406), no access (403). Any other (541 INTERNAL_ERROR in a cluster's hiccup, say) is the
#: broker's passing trouble: it ends the session, and the caller connects again.
REFUSALS = frozenset({403, 404, 406})


def _checked(channel: ChannelFactory, what: str, declare: Callable[..., Any]) -> None:
    """Run one declare on a fresh channel; turn the broker's refusal (``REFUSALS``) into
    ``TopologyError``."""
    from pika.exceptions import ChannelClosedByBroker

    ch = channel()
    try:
        declare(ch)
    except ChannelClosedByBroker as exc:
        if exc.reply_code not in REFUSALS:
            raise  # an AMQPError: a reconnecting loop starts a new session
        raise TopologyError(_explain(what, exc.reply_code, exc.reply_text)) from None
    if ch.is_open:
        ch.close()


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
