"""Whatever a dropped connection makes pika raise is a reconnect, never a dead process.

No broker needed: the connection is a stand-in that fails the way pika fails after a drop (its
ioloop closed: ``ValueError: Timeout closed before call`` from ``process_data_events``), then
the second session stops the loop. The real broker restarts are in test_delivery.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import leaseq
from leaseq.delivery import consumer as consumer_module
from leaseq.delivery import dispatcher as dispatcher_module
from leaseq.delivery.consumer import Consumer, ConsumerConfig
from leaseq.delivery.dispatcher import Dispatcher, DispatcherConfig
from leaseq.errors import InvalidURL, StoreUnavailable, TopologyError

CLOSED_IOLOOP = ValueError("Timeout closed before call")


class FakeChannel:
    consumer_tags: list[str] = []
    is_closed = False

    def basic_get(self, queue: str, auto_ack: bool = False) -> tuple[None, None, None]:
        return None, None, None

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class FakeConnection:
    """Opens channels; its event loop raises ``error`` (as pika's does after a drop) or, on
    the last session, sets ``stop``."""

    def __init__(self, error: BaseException | None, stop: threading.Event):
        self.error = error
        self.stop = stop
        self.is_open = False

    def channel(self) -> FakeChannel:
        return FakeChannel()

    def process_data_events(self, time_limit: float = 0) -> None:
        if self.error is not None:
            raise self.error
        self.stop.set()


class NoTopology:
    """``Topology`` as the consumer and the dispatcher use it, declaring nothing."""

    def ensure(self, conn: Any, queues: Any, *, declare: bool, warned: set[str]) -> list[Any]:
        for _ in queues:
            conn.channel()  # a session opens a channel per check, as the real one does
        return []

    def work_queue(self, queue: str) -> str:
        return f"leaseq.{queue}"

    def dispatcher_lock(self, queue: str) -> str:
        return f"leaseq.{queue}.dispatcher"

    def delivery_limit_queue(self, queue: str) -> str:
        return f"leaseq.{queue}.delivery-limit"


def sessions_failing_with(errors: list[BaseException], stop: threading.Event) -> Any:
    """A ``session`` stand-in: the n-th session's event loop raises ``errors[n]``; the one
    after the last stops the loop."""
    opened: list[int] = []

    @contextmanager
    def session(amqp_url: str, name: str) -> Iterator[FakeConnection]:
        n = len(opened)
        opened.append(n)
        yield FakeConnection(errors[n] if n < len(errors) else None, stop)

    session.opened = opened  # type: ignore[attr-defined]
    return session


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[leaseq.Queue]:
    store = leaseq.connect(f"sqlite:///{tmp_path / 'jobs.db'}")
    yield store.queue("jobs")
    store.close()


def run_consumer(queue: leaseq.Queue, session: Any, stop: threading.Event,
                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consumer_module, "session", session)
    consumer = Consumer([queue], lambda job: job, "amqp://", topology=NoTopology(),  # type: ignore[arg-type]
                        config=ConsumerConfig(grace_s=0, max_backoff_s=0.01))
    consumer.run(stop)


def run_dispatcher(queue: leaseq.Queue, session: Any, stop: threading.Event,
                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatcher_module, "session", session)
    dispatcher = Dispatcher([queue], "amqp://", topology=NoTopology(),  # type: ignore[arg-type]
                            config=DispatcherConfig(poll_interval_s=0.01, max_backoff_s=0.01))
    dispatcher.run(stop)


DROPS = [CLOSED_IOLOOP, AssertionError(), AttributeError("'NoneType' object has no attribute "
                                                         "'add_callback_threadsafe'"),
         ConnectionResetError(), StoreUnavailable("database is down")]


@pytest.mark.parametrize("run", [run_consumer, run_dispatcher], ids=["consumer", "dispatcher"])
def test_whatever_a_dropped_connection_raises_is_a_reconnect(
        run: Any, queue: leaseq.Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given sessions whose event loop fails the ways pika fails after a drop (and a store
    # outage), then one that runs until stopped
    stop = threading.Event()
    session = sessions_failing_with(list(DROPS), stop)
    # When the consumer / dispatcher runs
    run(queue, session, stop, monkeypatch)
    # Then it opened a new session after each failure instead of dying
    assert len(session.opened) == len(DROPS) + 1


@pytest.mark.parametrize("run", [run_consumer, run_dispatcher], ids=["consumer", "dispatcher"])
@pytest.mark.parametrize("refusal", [TopologyError("no dead-letter exchange"),
                                     InvalidURL("bad URL")], ids=["topology", "url"])
def test_a_refusal_of_leaseqs_own_is_raised_not_retried(
        run: Any, refusal: Exception, queue: leaseq.Queue,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a session that meets an error a new connection would meet again
    stop = threading.Event()
    session = sessions_failing_with([refusal], stop)
    # When it runs / Then the error is raised after one session
    with pytest.raises(type(refusal)):
        run(queue, session, stop, monkeypatch)
    assert len(session.opened) == 1


class BrokerClosedChannel(FakeChannel):
    is_closed = True  # as pika's channel reads once RabbitMQ closed it (consumer_timeout)


def sessions_first_channel_closed(stop: threading.Event) -> Any:
    """A ``session`` stand-in: the first session's channel is closed by the broker while its
    event loop raises nothing (pika's does not); the next session stops the loop."""
    opened: list[int] = []

    @contextmanager
    def session(amqp_url: str, name: str) -> Iterator[FakeConnection]:
        opened.append(len(opened))
        conn = FakeConnection(None, stop)
        if len(opened) == 1:
            conn.channel = BrokerClosedChannel  # type: ignore[method-assign]
            conn.process_data_events = lambda time_limit=0: None  # type: ignore[method-assign]
        yield conn

    session.opened = opened  # type: ignore[attr-defined]
    return session


def test_a_channel_the_broker_closed_is_a_reconnect(
        queue: leaseq.Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a session whose channel RabbitMQ closes, its connection still open and quiet
    stop = threading.Event()
    session = sessions_first_channel_closed(stop)
    # When the consumer runs (bounded: a consumer that never notices would run forever)
    thread = threading.Thread(target=run_consumer, args=(queue, session, stop, monkeypatch),
                              daemon=True)
    thread.start()
    thread.join(timeout=10)
    stop.set()
    # Then it opened a new session instead of waiting on the dead channel
    assert len(session.opened) == 2
