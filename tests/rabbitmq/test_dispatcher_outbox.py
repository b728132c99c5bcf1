"""The dispatcher prepares each store's outbox once, before its first ``outbox_due``
(``Store.prepare_outbox``: on PostgreSQL the build of ``jobs_outbox``, which the schema no
longer carries). The first tests need no broker (the stand-ins of test_reconnect.py); the last
runs a real dispatcher against RabbitMQ and PostgreSQL."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pika.exceptions import AMQPConnectionError
from rabbit_harness import Harness, wait_for
from test_reconnect import NoTopology, sessions_failing_with

import leaseq
from leaseq.delivery import dispatcher as dispatcher_module
from leaseq.delivery.connection import decode
from leaseq.delivery.dispatcher import Dispatcher, DispatcherConfig
from leaseq.delivery.topology import Topology
from leaseq.errors import StoreUnavailable
from leaseq.stores.postgres.options import parse_url

FAST = DispatcherConfig(poll_interval_s=0.01, max_backoff_s=0.01, reclaim_every_s=0)


class Recording:
    """A store proxy that logs ``prepare_outbox`` and ``outbox_due`` in ``calls`` and fails
    ``prepare_outbox`` with ``failures``, one per call, in order."""

    def __init__(self, store: leaseq.Store, failures: list[Exception]):
        self._store = store
        self._failures = failures
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def prepare_outbox(self, stop: threading.Event | None = None) -> None:
        self.calls.append("prepare_outbox")
        if self._failures:
            raise self._failures.pop(0)
        self._store.prepare_outbox(stop)

    def outbox_due(self, queue: str, limit: int) -> list[leaseq.Job]:
        self.calls.append("outbox_due")
        return self._store.outbox_due(queue, limit)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[leaseq.Store]:
    store = leaseq.connect(f"sqlite:///{tmp_path / 'jobs.db'}")
    yield store
    store.close()


def dispatch_one_round(store: Recording, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Run a dispatcher over two queues of ``store`` until its first idle wait; returns the
    broker session stand-in (``opened`` counts the sessions)."""
    stop = threading.Event()
    session = sessions_failing_with([], stop)
    monkeypatch.setattr(dispatcher_module, "session", session)
    queues = [leaseq.Queue(store, name) for name in ("a", "b")]  # type: ignore[arg-type]
    Dispatcher(queues, "amqp://", topology=NoTopology(), config=FAST).run(stop)  # type: ignore[arg-type]
    return session


def dispatch_until_published(dispatched: leaseq.Queue, harness: Harness,
                             queue: leaseq.Queue) -> Dispatcher:
    """Run a dispatcher of ``dispatched`` against the harness's broker until every job of
    ``queue`` is marked published; returns it, stopped."""
    stop = threading.Event()
    dispatcher = Dispatcher([dispatched], harness.amqp_url,
                            config=DispatcherConfig(poll_interval_s=0.05))
    thread = threading.Thread(target=dispatcher.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for("every job published", lambda: all(
            j.published_at is not None for j in queue.list_jobs(limit=10)), 30)
    finally:
        stop.set()
        thread.join(15)
    return dispatcher


def test_each_store_is_prepared_once_before_the_first_outbox_due(
        sqlite_store: leaseq.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a dispatcher over two queues of one store
    store = Recording(sqlite_store, [])
    # When it runs a round
    dispatch_one_round(store, monkeypatch)
    # Then the store's outbox was prepared once, before either queue's outbox was read
    assert store.calls == ["prepare_outbox", "outbox_due", "outbox_due"]


def test_a_store_outage_while_preparing_is_a_reconnect(
        sqlite_store: leaseq.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a store that is down for the dispatcher's first try
    store = Recording(sqlite_store, [StoreUnavailable("database is down")])
    # When the dispatcher runs
    session = dispatch_one_round(store, monkeypatch)
    # Then it tried again, prepared the outbox, and only then opened its broker session
    assert store.calls == ["prepare_outbox", "prepare_outbox", "outbox_due", "outbox_due"]
    assert len(session.opened) == 1


def test_another_failure_to_prepare_is_logged_and_publishing_goes_on(
        sqlite_store: leaseq.Store, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # Given a store that refuses to prepare its outbox (say, a role that may not build an index)
    store = Recording(sqlite_store, [RuntimeError("must be owner of table jobs")])
    # When the dispatcher runs
    with caplog.at_level(logging.WARNING, logger="leaseq.delivery.dispatcher"):
        dispatch_one_round(store, monkeypatch)
    # Then it said so and published without: the index makes outbox_due fast, not correct
    assert store.calls == ["prepare_outbox", "outbox_due", "outbox_due"]
    (warning,) = [r for r in caplog.records if "could not prepare the outbox" in r.message]
    # (with the error's redacted traceback in the message, never a raw exc_info)
    assert "RuntimeError: must be owner of table jobs" in warning.message
    assert "Traceback" in warning.message and warning.exc_info is None


def outbox_index_valid(harness: Harness) -> bool | None:
    """Whether the harness schema's ``jobs_outbox`` is valid; None when there is none."""
    store: Any = harness.store()
    conninfo, _ = parse_url(harness.store_url)
    with psycopg.connect(conninfo) as conn:
        row = conn.execute(store.queries["outbox_index_valid"]).fetchone()
    return None if row is None else bool(row[0])


@pytest.mark.rabbitmq
@pytest.mark.postgres
def test_on_postgresql_the_dispatcher_builds_jobs_outbox_before_its_first_read(
        postgres_harness: Harness) -> None:
    # Given a fresh PostgreSQL schema, which has no jobs_outbox, and three jobs owed a publish
    harness = postgres_harness
    assert outbox_index_valid(harness) is None
    queue = harness.queue()
    queue.enqueue_many([queue.spec(f"j{i}", {}) for i in range(3)])
    seen: list[bool | None] = []

    class Watching(Recording):
        def outbox_due(self, queue: str, limit: int) -> list[leaseq.Job]:
            seen.append(outbox_index_valid(harness))
            return super().outbox_due(queue, limit)

    store = Watching(harness.store(), [])
    # When a dispatcher starts and publishes them
    dispatch_until_published(leaseq.Queue(store, "jobs"), harness, queue)  # type: ignore[arg-type]
    # Then jobs_outbox was there, valid, at its first outbox_due, and is still
    assert seen and seen[0] is True, seen
    assert outbox_index_valid(harness) is True


# --- what a round publishes and marks ----------------------------------------------------------

LONG_ID = "L" * 300  # a job id may have 512 bytes; an AMQP message_id at most 255


class FramingChannel:
    """A channel stand-in that frames each message's properties as pika does before sending
    (``BasicProperties.encode``), confirms it, and fails the ``fail_at``-th publish with a
    lost connection."""

    def __init__(self, fail_at: int | None = None):
        self.fail_at = fail_at
        self.sent: list[tuple[bytes, Any]] = []

    def basic_publish(self, exchange: str, routing_key: str, body: bytes, properties: Any,
                      mandatory: bool = False) -> None:
        from pika.exceptions import AMQPConnectionError
        if self.fail_at is not None and len(self.sent) + 1 == self.fail_at:
            raise AMQPConnectionError("connection lost")
        properties.encode()
        self.sent.append((body, properties))


class Exchange(NoTopology):
    exchange = "leaseq"


def _owed(store: leaseq.Store, *ids: str) -> leaseq.Queue:
    queue = leaseq.Queue(store, "jobs")
    for job_id in ids:
        queue.enqueue(job_id, {})
    return queue


def _round(queue: leaseq.Queue, channel: FramingChannel) -> Any:
    return Dispatcher([queue], "amqp://", topology=Exchange(),  # type: ignore[arg-type]
                      config=FAST).run_once(channel, queue)  # type: ignore[arg-type]


def test_a_job_id_longer_than_a_message_id_is_published_under_its_hash(
        sqlite_store: leaseq.Store) -> None:
    # Given a job whose id is longer than AMQP lets a message_id be, between two others
    queue = _owed(sqlite_store, "a-before", LONG_ID, "z-after")
    # When a round publishes them
    channel = FramingChannel()
    done = _round(queue, channel)
    # Then all three went out and are marked: the long id's message carries its SHA-256 as
    # message_id and the id itself in the body, which is what the consumer claims
    assert (done.published, done.marked, done.refused) == (3, 3, [])
    message_ids = {decode(body): props.message_id for body, props in channel.sent}
    assert message_ids == {
        ("jobs", "a-before"): "a-before", ("jobs", "z-after"): "z-after",
        ("jobs", LONG_ID): "sha256:" + hashlib.sha256(LONG_ID.encode()).hexdigest()}
    assert all(j.published_at is not None for j in queue.list_jobs(limit=10))


def test_jobs_the_broker_confirmed_before_the_session_was_lost_are_marked(
        sqlite_store: leaseq.Store) -> None:
    # Given three owed jobs, and a connection lost at the second publish
    queue = _owed(sqlite_store, "a", "b", "c")
    # When a round publishes them
    with pytest.raises(AMQPConnectionError):
        _round(queue, FramingChannel(fail_at=2))
    # Then the first, which the broker confirmed, is marked (not published anew at every
    # reconnect), and the other two are still owed
    assert [j.id for j in queue.outbox_due(10)] == ["b", "c"]
    assert queue.get("a").published_at is not None  # type: ignore[union-attr]


def test_a_dispatcher_publishes_a_job_with_a_long_id_and_the_jobs_after_it(
        harness: Harness) -> None:
    # Given a job whose id is longer than a message_id may be, between two others
    queue = harness.queue()
    for job_id in ("a-before", LONG_ID, "z-after"):
        queue.enqueue(job_id, {})
    # When a dispatcher runs against RabbitMQ
    dispatcher = dispatch_until_published(queue, harness, queue)
    # Then the work queue holds one message per job: none went out twice
    assert _ready_messages(harness.amqp_url, dispatcher.topology.work_queue("jobs")) == 3


def test_leaseq_dispatch_without_queue_publishes_a_queue_made_after_it_started(
        harness: Harness) -> None:
    # Given a store holding a job of queue "alpha" only, and `leaseq dispatch` started
    # without --queue, which publishes that job
    store = harness.store()
    alpha, beta = store.queue("alpha"), store.queue("beta")
    alpha.enqueue("a-1", {})
    harness.start_cli_dispatcher(queues=())
    wait_for("alpha's job published",
             lambda: alpha.get("a-1").published_at is not None, 30, harness)  # type: ignore[union-attr]
    # When a job is enqueued into queue "beta", which held none when the dispatcher started
    beta.enqueue("b-1", {})
    # Then the running dispatcher publishes it too, into beta's own work queue
    wait_for("beta's job published",
             lambda: beta.get("b-1").published_at is not None, 30, harness)  # type: ignore[union-attr]
    assert _ready_messages(harness.amqp_url, Topology().work_queue("beta")) == 1
    assert "published" in [e.event for e in beta.journal("b-1")]


def _ready_messages(amqp_url: str, queue_name: str) -> int:
    import pika
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        return connection.channel().queue_declare(
            queue_name, passive=True).method.message_count
    finally:
        connection.close()


class Serviced:
    """A connection stand-in that counts how often its I/O is serviced."""

    def __init__(self) -> None:
        self.calls = 0

    def process_data_events(self, time_limit: float = 0) -> None:
        self.calls += 1
        time.sleep(min(time_limit, 0.01))


def test_a_pause_after_a_refused_publish_keeps_the_connection_answered() -> None:
    # Given a dispatcher's connection, and the wait after a refused publish (retry_publish_s)
    conn = Serviced()
    # When it waits, Then the connection's I/O is serviced all along (heartbeats answered), not
    # left alone for the whole wait
    dispatcher_module.pause(conn, threading.Event(), 0.2)  # type: ignore[arg-type]
    assert conn.calls >= 5
    # And a stop ends the wait at once
    stop = threading.Event()
    stop.set()
    before = conn.calls
    dispatcher_module.pause(conn, stop, 60)  # type: ignore[arg-type]
    assert conn.calls == before
