"""The holding queues' delivery limit by broker version: from RabbitMQ 4 ``P.Q.quarantine``
and ``P.Q.delivery-limit`` are declared with ``x-delivery-limit: -1`` (4.0 would otherwise give
them a limit of 20 and drop what is returned that often); before 4 without it (3.x reads -1 as
0). A holding queue that exists without it is used as it is, with one warning per start.

The broker is a fake here; tests/rabbitmq/test_holding_queue_limit.py runs the same paths on the
real one."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

pika_exceptions = pytest.importorskip("pika.exceptions", reason="leaseq[rabbitmq] is not installed")

from leaseq.delivery.connection import broker_version  # noqa: E402
from leaseq.delivery.topology import Topology, lacks_delivery_limit  # noqa: E402
from leaseq.errors import TopologyError  # noqa: E402

TOPOLOGY = Topology()
HOLDING = (TOPOLOGY.quarantine_queue("mail"), TOPOLOGY.delivery_limit_queue("mail"))
QUORUM = {"x-queue-type": "quorum"}
#: RabbitMQ 3.10.8's answer, measured, to a declare with -1 of a queue declared without it.
NO_LIMIT_TEXT = ("PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue "
                 "'leaseq.mail.quarantine' in vhost '/': received the value '-1' of type "
                 "'signedint' but current is none")


class FakeBroker:
    """A connection to a broker holding ``queues`` (name → arguments), answering a declare
    with other arguments as RabbitMQ does: 406 naming the first one that differs."""

    def __init__(self, version: Any, queues: dict[str, dict[str, Any]] | None = None):
        self._impl = SimpleNamespace(server_properties={"version": version})
        self.queues = dict(queues or {})
        self.declares: list[tuple[str, dict[str, Any]]] = []

    def channel(self) -> FakeChannel:
        return FakeChannel(self)


class FakeChannel:
    def __init__(self, broker: FakeBroker):
        self.broker, self.is_open = broker, True

    def queue_declare(self, name: str, passive: bool = False, durable: bool = False,
                      arguments: dict[str, Any] | None = None) -> None:
        if passive:
            if name not in self.broker.queues:
                self._refuse(404, f"NOT_FOUND - no queue '{name}'")
            return
        args = arguments or {}
        self.broker.declares.append((name, args))
        current = self.broker.queues.setdefault(name, args)
        for key in ("x-queue-type", *sorted(set(current) | set(args))):
            if current.get(key) != args.get(key):
                had = "none" if key not in current else repr(current[key])
                self._refuse(406, f"PRECONDITION_FAILED - inequivalent arg '{key}' for queue "
                                  f"'{name}' in vhost '/': received {args.get(key)!r} but "
                                  f"current is {had}")

    def _refuse(self, code: int, text: str) -> None:
        self.is_open = False
        raise pika_exceptions.ChannelClosedByBroker(code, text)

    def close(self) -> None:
        self.is_open = False

    def __getattr__(self, name: str) -> Any:  # exchange_declare, queue_bind, …: accepted
        return lambda *args, **kwargs: None


def holding_declares(broker: FakeBroker) -> list[dict[str, Any]]:
    return [args for name, args in broker.declares if name in HOLDING]


@pytest.mark.parametrize("given, expected", [
    ("3.10.8", (3, 10, 8)), (b"4.0.5", (4, 0, 5)), ("4.1.0-rc.1", (4, 1, 0)),
    (None, ()), ("unknown", ()), (42, ())])
def test_the_broker_version_is_read_from_the_handshake(given: Any, expected: tuple) -> None:
    assert broker_version(FakeBroker(given)) == expected


@pytest.mark.parametrize("broker, limit", [
    ((3, 10, 8), None), ((3, 13, 7), None), ((), None), ((4,), -1), ((4, 0, 5), -1),
    ((5, 1), -1)])
def test_holding_arguments_lift_the_limit_from_rabbitmq_4_only(broker: tuple,
                                                               limit: int | None) -> None:
    args = Topology.holding_arguments(broker)
    assert args["x-queue-type"] == "quorum"
    assert args.get("x-delivery-limit") == limit


@pytest.mark.parametrize("code, text, tolerated", [
    (406, NO_LIMIT_TEXT, True),
    (406, "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q' in vhost "
          "'/': received '-1' but current is '5'", False),
    (406, "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': "
          "received the value 'quorum' of type 'longstr' but current is none", False),
    (404, "NOT_FOUND - no queue 'q'", False)])
def test_only_a_missing_delivery_limit_is_tolerated(code: int, text: str,
                                                    tolerated: bool) -> None:
    exc = pika_exceptions.ChannelClosedByBroker(code, text)
    assert lacks_delivery_limit(exc) is tolerated


def test_on_3x_the_holding_queues_are_declared_without_a_limit() -> None:
    # Given a RabbitMQ 3.10 broker with nothing declared
    broker = FakeBroker("3.10.8")
    # When leaseq declares its topology / Then the holding queues get no x-delivery-limit
    assert TOPOLOGY.ensure(broker, ["mail"], declare=True, warned=set()) == []
    assert holding_declares(broker) and all(a == QUORUM for a in holding_declares(broker))


def test_on_4x_fresh_holding_queues_are_declared_unlimited() -> None:
    broker = FakeBroker("4.0.5")
    assert TOPOLOGY.ensure(broker, ["mail"], declare=True, warned=set()) == []
    for name in HOLDING:
        assert broker.queues[name] == {**QUORUM, "x-delivery-limit": -1}


@pytest.mark.parametrize("declare", [True, False])
def test_on_4x_holding_queues_declared_without_a_limit_are_kept_with_a_warning(
        declare: bool, caplog: pytest.LogCaptureFixture) -> None:
    # Given holding queues an older leaseq declared (no x-delivery-limit), on RabbitMQ 4
    broker = FakeBroker("4.0.5", {name: QUORUM for name in HOLDING})
    if not declare:
        TOPOLOGY.ensure(broker, ["mail"], declare=True, warned={*HOLDING})
    warned: set[str] = set()
    # When leaseq starts on it, then connects again (a second session of the same start)
    with caplog.at_level(logging.WARNING, logger="leaseq.delivery.topology"):
        for _ in range(2):
            limited = TOPOLOGY.ensure(broker, ["mail"], declare=declare, warned=warned)
            assert limited == [("mail", name) for name in HOLDING]
    # Then no TopologyError, the queues are left as they are, checked with their own
    # arguments, and each is named in one warning saying what to do
    assert all(broker.queues[name] == QUORUM for name in HOLDING)
    assert QUORUM in holding_declares(broker)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    for name, message in zip(HOLDING, messages, strict=True):
        assert repr(name) in message
        assert "default delivery limit of 20" in message
        assert "`leaseq rabbitmq topology --queue mail`" in message
    assert {r.action for r in caplog.records} == {"holding_queue_limited"}


def test_the_warning_names_a_non_default_prefix() -> None:
    message = Topology(prefix="app").limit_warning("mail", "app.mail.quarantine")
    assert "`leaseq rabbitmq topology --queue mail --prefix app`" in message


def test_on_4x_any_other_inequivalence_is_still_refused() -> None:
    # Given a quarantine queue someone declared as a classic queue, on RabbitMQ 4
    broker = FakeBroker("4.0.5", {HOLDING[0]: {}})
    # When leaseq declares / Then it refuses, naming the argument
    with pytest.raises(TopologyError, match="x-queue-type"):
        TOPOLOGY.ensure(broker, ["mail"], declare=True, warned=set())


def test_on_4x_a_holding_queue_with_another_limit_is_refused() -> None:
    broker = FakeBroker("4.0.5", {HOLDING[1]: {**QUORUM, "x-delivery-limit": 5}})
    with pytest.raises(TopologyError, match="x-delivery-limit"):
        TOPOLOGY.ensure(broker, ["mail"], declare=True, warned=set())
