"""PostgreSQL-specific: enqueue inside the caller's transaction, and follow-up jobs written in
the completion's transaction. (Store-specific because only PostgreSQL takes a caller's
connection; the conformance suite covers what every store does.)"""

from __future__ import annotations

import psycopg
import pytest

from leaseq.errors import InvalidInput, JobConflict
from leaseq.job import LeaseLost
from leaseq.stores.postgres import PostgresStore


def test_enqueue_in_callers_transaction_is_visible_only_after_commit(
        store: PostgresStore, pg_url: str) -> None:
    # Given a job enqueued through the caller's own open transaction
    q = store.queue("mail")
    with psycopg.connect(pg_url) as conn:
        conn.execute("SELECT 1")  # the caller's transaction is open
        result = q.enqueue("welcome-1", {"to": "a@example.com"}, connection=conn)
        assert result.outcome == "created"
        # Then nobody else sees it before the commit
        assert q.get("welcome-1") is None
        assert q.claim("w1") == []
        # When the caller commits
        conn.commit()
    # Then the job is there, with its journal
    assert q.get("welcome-1").status == "pending"
    assert [e.event for e in q.journal("welcome-1")] == ["enqueued"]


def test_enqueue_in_callers_transaction_rolls_back_with_it(
        store: PostgresStore, schema_url: str, pg_url: str) -> None:
    # Given a waiting worker in another store (another process, as far as it can tell)
    other = PostgresStore.from_url(schema_url)
    try:
        assert other.wait_for_work(["mail"], 0.01) is False  # LISTEN is now in place
        q = store.queue("mail")
        # When a job is enqueued in the caller's transaction, which then rolls back
        with psycopg.connect(pg_url) as conn:
            q.enqueue("welcome-2", {"to": "b@example.com"}, connection=conn)
            conn.rollback()
            # Then the caller's connection is still usable
            assert conn.execute("SELECT 2").fetchone() == (2,)
        # And there is no job and no wake-up
        assert q.get("welcome-2") is None
        assert q.journal("welcome-2") == []
        assert other.wait_for_work(["mail"], 0.5) is False
    finally:
        other.close()


def test_a_conflict_undoes_only_the_enqueue_not_the_callers_transaction(
        store: PostgresStore, pg_url: str) -> None:
    # Given a stored job, and a caller's transaction with its own write
    q = store.queue("mail")
    q.enqueue("j1", {"v": 1})
    with psycopg.connect(pg_url) as conn:
        conn.execute("CREATE TEMP TABLE mine (x int)")
        conn.execute("INSERT INTO mine VALUES (1)")
        # When an enqueue in it conflicts
        with pytest.raises(JobConflict):
            q.enqueue_many([q.spec("j2", {}), q.spec("j1", {"v": 2})], connection=conn)
        # Then the caller's own write survives and its transaction goes on
        assert conn.execute("SELECT count(*) FROM mine").fetchone() == (1,)
        conn.commit()
    # And nothing of the failed enqueue was written
    assert q.get("j2") is None
    assert q.get("j1").payload == {"v": 1}


def test_autocommit_connection_without_transaction_is_refused(
        store: PostgresStore, pg_url: str) -> None:
    # Given a connection in autocommit mode with no transaction open
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # When it is used for a transactional enqueue, then it is refused before any write
        with pytest.raises(InvalidInput, match="autocommit"):
            store.queue("mail").enqueue("j1", {}, connection=conn)
        # But inside an explicit transaction block it works
        with conn.transaction():
            store.queue("mail").enqueue("j1", {}, connection=conn)
    assert store.queue("mail").get("j1") is not None


def test_follow_ups_are_written_with_the_completion(store: PostgresStore) -> None:
    # Given a claimed job
    q = store.queue("resize")
    q.enqueue("img-1", {"src": "a.png"})
    (job,) = q.claim("w1")
    # When it completes with follow-ups in this queue and another
    done = q.complete(job, {"ok": True},
                      then=[q.spec("img-1-thumb", {"size": 64}),
                            ("notify", q.spec("tell-1", {"img": "img-1"}))])
    # Then the result and both follow-ups are there
    assert done.status == "done" and done.result == {"ok": True}
    assert q.get("img-1-thumb").status == "pending"
    assert store.queue("notify").get("tell-1").status == "pending"


def test_fenced_out_completion_writes_no_follow_up(store: PostgresStore) -> None:
    # Given a job whose lease was taken over by another worker
    q = store.queue("resize")
    q.enqueue("img-2", {"src": "b.png"})
    old = q.claim_one("img-2", "w1", lease_s=60)
    store.time_offset_s += 61
    (new,) = q.claim("w2")
    assert new.lease_epoch == old.lease_epoch + 1
    # When the old worker completes with a follow-up
    with pytest.raises(LeaseLost):
        q.complete(old, {"ok": True}, then=[q.spec("img-2-thumb", {})])
    # Then neither the result nor the follow-up was written
    assert q.get("img-2-thumb") is None
    assert q.get("img-2").status == "processing"
    assert q.get("img-2").result is None


def test_a_failing_follow_up_rolls_back_the_completion(store: PostgresStore) -> None:
    # Given a claimed job
    q = store.queue("resize")
    q.enqueue("img-3", {"src": "c.png"})
    (job,) = q.claim("w1")
    # When a follow-up cannot be written (PostgreSQL text cannot hold NUL)
    with pytest.raises(InvalidInput):
        q.complete(job, {"ok": True}, then=[q.spec("img-3-thumb", {}, task="bad\x00task")])
    # Then the completion did not happen either: the job is still held by its worker
    after = q.get("img-3")
    assert after.status == "processing" and after.result is None
    assert q.complete(job, {"ok": True}).status == "done"
