"""PostgreSQL-specific: key-limited claims against changes that land while they wait on a
lock. Store-specific: the races are in this store's own statements and isolation (SQLite runs
every claim under BEGIN IMMEDIATE; MongoDB's write conflict makes a claim start again), so
each is made to happen here by holding a lock until the claim waits on it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from pg_locks import until_blocked_by

from leaseq.stores.postgres import PostgresStore

# default_transaction_isolation=repeatable read, as a server, database or role may set it
REPEATABLE_READ = "options=-c%20default_transaction_isolation%3Drepeatable%5C%20read"


def in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = work()
        except BaseException as exc:  # reported to the test's thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def processing(pg_url: str, store: PostgresStore, key: str) -> int:
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{store.options.schema}".jobs '
                           "WHERE concurrency_key = %s AND status = 'processing'",
                           [key]).fetchone()
    return int(row[0]) if row else 0


def test_claim_one_reads_the_key_of_a_revision_committed_while_it_waited(
        store: PostgresStore, pg_url: str) -> None:
    # Given key B at its limit (1), and job x pending under key A
    q = store.queue("lim", key_limit=1)
    q.enqueue("busy", {"n": 0}, concurrency_key="B")
    assert [j.id for j in q.claim("w0", 1)] == ["busy"]
    q.enqueue("x", {"n": 1}, concurrency_key="A")
    with psycopg.connect(pg_url) as producer:
        # and a producer's open transaction moving x to key B (a new revision)
        q.enqueue("x", {"n": 2}, concurrency_key="B", revision="r2", connection=producer)
        # When a broker delivery claims x while that transaction holds x's row
        thread, box = in_thread(lambda: q.claim_one("x", "w1"))
        until_blocked_by(pg_url, producer.info.backend_pid)
        producer.commit()
        thread.join(30)
    # Then x is not taken into the full key B
    assert "error" not in box, box
    assert box["result"] is None
    assert processing(pg_url, store, "B") == 1


@pytest.fixture
def repeatable_read_url(schema_url: str) -> str:
    return f"{schema_url}&{REPEATABLE_READ}"


@pytest.fixture
def two_stores(repeatable_read_url: str) -> Iterator[tuple[PostgresStore, PostgresStore]]:
    first = PostgresStore.from_url(repeatable_read_url)
    second = PostgresStore.from_url(repeatable_read_url)
    yield first, second
    second.close()
    first.close()


def test_leaseq_sessions_are_read_committed_whatever_the_default(
        two_stores: tuple[PostgresStore, PostgresStore]) -> None:
    # Given a server whose default isolation is REPEATABLE READ (the URL's options say so)
    store, _ = two_stores
    # When leaseq runs a transaction, Then it is READ COMMITTED, as the limits need
    level = store._session.run(
        lambda conn: conn.execute("SHOW transaction_isolation").fetchone()[0])
    assert level == "read committed"


def test_key_limited_claims_queued_on_the_limits_lock_hold_the_limit_under_repeatable_read(
        two_stores: tuple[PostgresStore, PostgresStore], pg_url: str) -> None:
    # Given key A (limit 1) with two pending jobs, on a server defaulting to REPEATABLE READ
    first, second = two_stores
    q1, q2 = first.queue("lim", key_limit=1), second.queue("lim", key_limit=1)
    q1.enqueue("a1", {"n": 1}, concurrency_key="A")
    q1.enqueue("a2", {"n": 2}, concurrency_key="A")
    [taken] = q1.claim("w0", 1)  # makes the queue's limits row
    first.give_back("lim", taken.lease, started=False, reason="test")
    schema = first.options.schema
    with psycopg.connect(pg_url) as holder:
        # and another claim's turn: a session holding the queue's limits row
        holder.execute(f'SELECT 1 FROM "{schema}".limits WHERE queue = %s FOR UPDATE', ["lim"])
        # When a delivery's claim_one and a worker's claim queue up behind it, in that order
        one, one_box = in_thread(lambda: q1.claim_one("a1", "w1"))
        until_blocked_by(pg_url, holder.info.backend_pid, waiters=1)
        batch, batch_box = in_thread(lambda: q2.claim("w2", 1))
        until_blocked_by(pg_url, holder.info.backend_pid, waiters=2)
        holder.commit()
        one.join(30)
        batch.join(30)
    # Then the second sees what the first claimed: one job of key A runs, not two
    assert "error" not in one_box and "error" not in batch_box, (one_box, batch_box)
    assert one_box["result"] is not None and batch_box["result"] == []
    assert processing(pg_url, first, "A") == 1
