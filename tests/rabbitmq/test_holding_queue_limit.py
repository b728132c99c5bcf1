"""The holding queues' delivery limit on the real broker (RabbitMQ 3.10 here), each test in its
own vhost.

On 3.x leaseq declares ``P.Q.quarantine`` and ``P.Q.delivery-limit`` without
``x-delivery-limit`` (3.x reads -1 as 0: a message dropped at its first return). The RabbitMQ 4
path is forced by giving leaseq the version 4.0.5 in place of the broker's: 3.10 accepts a fresh
queue declared with -1, and answers 406 for a redeclare with other arguments as 4.x does, so
what leaseq declares, keeps and refuses is proven here. What this broker cannot show is the
drop itself (4.0's default limit of 20 discarding a message returned that often from a queue
declared without the argument, and -1 keeping it): that needs a RabbitMQ 4 broker, which these
tests do not have. Messages are never delivered from the queues declared here with -1: on 3.10
that limit reads as 0.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from click.testing import CliRunner

from leaseq.cli import cli
from leaseq.delivery import topology as topology_module
from leaseq.delivery.rabbitmq import Topology, declare_topology
from leaseq.errors import TopologyError

pytestmark = pytest.mark.rabbitmq

TOPOLOGY = Topology()
HOLDING = (TOPOLOGY.quarantine_queue("jobs"), TOPOLOGY.delivery_limit_queue("jobs"))
QUORUM = {"x-queue-type": "quorum"}
UNLIMITED = {**QUORUM, "x-delivery-limit": -1}


@pytest.fixture
def rabbitmq_4(monkeypatch: pytest.MonkeyPatch) -> None:
    """leaseq reads the broker's version as 4.0.5."""
    monkeypatch.setattr(topology_module, "broker_version", lambda _conn: (4, 0, 5))


@pytest.fixture
def broker(amqp_url: str) -> Iterator[pika.BlockingConnection]:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        yield conn
    finally:
        conn.close()


def older_topology(conn: pika.BlockingConnection) -> None:
    """The topology as an older leaseq, or leaseq under 3.x, declared it."""
    TOPOLOGY.declare(conn.channel, "jobs", broker=(3, 10, 8))


def leaseq_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """leaseq's records (pika logs each channel the broker closes)."""
    return [r for r in caplog.records if r.name.startswith("leaseq")]


def redeclare(conn: pika.BlockingConnection, name: str, args: dict[str, Any]) -> str:
    """``ok``, or the broker's refusal of an active declare of ``name`` with ``args``."""
    try:
        conn.channel().queue_declare(name, durable=True, arguments=args)
    except pika.exceptions.ChannelClosedByBroker as exc:
        return f"{exc.reply_code} {exc.reply_text}"
    return "ok"


def test_on_3x_the_holding_queues_are_declared_without_a_limit(
        amqp_url: str, broker: pika.BlockingConnection) -> None:
    # Given this RabbitMQ 3.10 broker, read as what it is
    # When leaseq declares its topology
    assert declare_topology(["jobs"], amqp_url) == []
    # Then the holding queues have no x-delivery-limit: a declare without it is equivalent,
    # one with -1 is not
    for name in HOLDING:
        assert redeclare(broker, name, QUORUM) == "ok"
        refusal = redeclare(broker, name, UNLIMITED)
        assert refusal.startswith("406") and "x-delivery-limit" in refusal
        assert refusal.endswith("current is none")


def test_on_4x_fresh_holding_queues_are_declared_unlimited(
        amqp_url: str, broker: pika.BlockingConnection, rabbitmq_4: None,
        caplog: pytest.LogCaptureFixture) -> None:
    # Given a vhost with nothing declared, on a broker leaseq reads as RabbitMQ 4
    # When leaseq declares its topology, then checks it
    with caplog.at_level(logging.WARNING, logger="leaseq.delivery.topology"):
        assert declare_topology(["jobs"], amqp_url) == []
        assert declare_topology(["jobs"], amqp_url, declare=False) == []
    # Then the holding queues have x-delivery-limit -1, and nothing was warned about
    for name in HOLDING:
        assert redeclare(broker, name, UNLIMITED) == "ok"
        refusal = redeclare(broker, name, QUORUM)
        assert refusal.startswith("406") and "x-delivery-limit" in refusal
    assert not leaseq_records(caplog)


@pytest.mark.parametrize("declare", [True, False])
def test_on_4x_holding_queues_declared_without_a_limit_are_kept_with_a_warning(
        amqp_url: str, broker: pika.BlockingConnection, rabbitmq_4: None, declare: bool,
        caplog: pytest.LogCaptureFixture) -> None:
    # Given the topology an older leaseq (or leaseq under 3.x) declared
    older_topology(broker)
    # When leaseq starts on it as on RabbitMQ 4, declaring or only checking
    with caplog.at_level(logging.WARNING, logger="leaseq.delivery.topology"):
        limited = declare_topology(["jobs"], amqp_url, declare=declare)
    # Then it runs (no TopologyError), says which queues keep the default limit and what
    # to do, once each, and leaves them as they were
    assert limited == [("jobs", name) for name in HOLDING]
    warnings = [r.getMessage() for r in leaseq_records(caplog)]
    assert len(warnings) == 2
    for name, message in zip(HOLDING, warnings, strict=True):
        assert repr(name) in message and "default delivery limit of 20" in message
        assert "`leaseq rabbitmq topology --queue jobs`" in message
    for name in HOLDING:
        assert redeclare(broker, name, QUORUM) == "ok"


def test_on_4x_the_remedy_declares_the_queue_again_unlimited(
        amqp_url: str, broker: pika.BlockingConnection, rabbitmq_4: None) -> None:
    # Given an older topology whose quarantine queue the operator drained and deleted
    older_topology(broker)
    broker.channel().queue_delete(HOLDING[0])
    # When `leaseq rabbitmq topology --queue jobs` runs as the warning says
    limited = declare_topology(["jobs"], amqp_url)
    # Then the quarantine queue is declared again with -1; only the other still has the limit
    assert limited == [("jobs", HOLDING[1])]
    assert redeclare(broker, HOLDING[0], UNLIMITED) == "ok"


def test_on_4x_any_other_inequivalence_is_still_refused(
        amqp_url: str, broker: pika.BlockingConnection, rabbitmq_4: None) -> None:
    # Given a quarantine queue declared as a classic queue by someone else
    broker.channel().queue_declare(HOLDING[0], durable=True)
    # When leaseq starts on it / Then it refuses, naming the argument
    with pytest.raises(TopologyError, match="x-queue-type"):
        declare_topology(["jobs"], amqp_url)


def test_the_topology_command_names_a_holding_queue_with_the_default_limit(
        amqp_url: str, broker: pika.BlockingConnection, rabbitmq_4: None) -> None:
    # Given an older topology, on a broker read as RabbitMQ 4
    older_topology(broker)
    # When the operator checks it
    done = CliRunner().invoke(cli, ["rabbitmq", "topology", "--amqp-url", amqp_url,
                                    "--queue", "jobs", "--no-declare"])
    # Then it succeeds and names each such queue and the remedy
    assert done.exit_code == 0, done.output
    for name in HOLDING:
        assert f"{name}: RabbitMQ 4's default delivery limit of 20 applies" in done.output
    assert "drain it, delete it, and run this command again" in done.output
