"""PostgreSQL-specific: a statement retried because its answer was lost after the server
committed (the connection cut between the commit and the reply) tells the story once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from leaseq.delivery.dispatcher import Dispatcher
from leaseq.stores.postgres import PostgresStore
from leaseq.stores.postgres.watchdog import cut


@contextmanager
def answer_lost_once(store: PostgresStore, reader: str, query: str) -> Iterator[None]:
    """The first run of ``query`` through ``store.<reader>`` commits (autocommitted), then its
    connection is cut before the client reads anything more: the session sees a lost
    connection of unknown outcome and runs the statement again."""
    read = getattr(store, reader)
    fired = []

    def answered_then_lost(conn: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        out = read(conn, name, *args, **kwargs)
        if name == query and not fired:
            fired.append(name)
            cut(conn)
            conn.execute("SELECT 1")  # psycopg.OperationalError: the connection is gone
        return out

    setattr(store, reader, answered_then_lost)
    try:
        yield
    finally:
        delattr(store, reader)
    assert fired, f"{query} never ran"


def test_a_retried_beat_journals_a_lost_lease_once(store: PostgresStore) -> None:
    # Given a worker holding one lease, and one it lost (the job finished under it)
    q = store.queue("work")
    q.enqueue("held", {})
    q.enqueue("lost", {})
    held, lost = sorted(q.claim("host:1:w1", 2), key=lambda j: j.id != "held")
    q.complete(lost)
    # When a beat of both commits and its answer is lost, so it runs again
    with answer_lost_once(store, "_tuples", "heartbeat"):
        assert q.heartbeat([held, lost]) == ["lost"]
    # Then the lost lease is journaled once
    assert [e.event for e in q.journal("lost")].count("heartbeat_lost") == 1


def test_a_retried_mark_journals_one_publish(store: PostgresStore) -> None:
    # Given a job the broker confirmed
    q = store.queue("work")
    q.enqueue("j1", {})
    confirmed = q.outbox_due()
    dispatcher = Dispatcher([q], "amqp://")
    # When the dispatcher's mark commits and its answer is lost, so it runs again
    with answer_lost_once(store, "_rows", "mark_published"):
        dispatcher._mark(q, confirmed)
    # Then the job is published, and its story tells one publish (the retry marked nothing,
    # and that is no "confirmed after the job moved on")
    assert q.get("j1").published_at is not None  # type: ignore[union-attr]
    published = [e for e in q.journal("j1") if e.event == "published"]
    assert [e.reason for e in published] == [None]
