"""The dispatcher prepares each store's outbox once, before its first ``outbox_due``
(``Store.prepare_outbox``: on PostgreSQL the build of ``jobs_outbox``, which the schema no
longer carries). The first tests need no broker (the stand-ins of test_reconnect.py); the last
runs a real dispatcher against RabbitMQ and PostgreSQL."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from rabbit_harness import Harness, wait_for
from test_reconnect import NoTopology, sessions_failing_with

import leaseq
from leaseq.delivery import dispatcher as dispatcher_module
from leaseq.delivery.dispatcher import Dispatcher, DispatcherConfig
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
    stop = threading.Event()
    dispatcher = Dispatcher([leaseq.Queue(store, "jobs")], harness.amqp_url,  # type: ignore[arg-type]
                            config=DispatcherConfig(poll_interval_s=0.05))
    thread = threading.Thread(target=dispatcher.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for("three jobs published", lambda: all(
            j.published_at is not None for j in queue.list_jobs(limit=10)), 30)
    finally:
        stop.set()
        thread.join(15)
    # Then jobs_outbox was there, valid, at its first outbox_due, and is still
    assert seen and seen[0] is True, seen
    assert outbox_index_valid(harness) is True
