"""A state change and its journal entries (issue 11, 7): together in one transaction where the
deployment has transactions; on a standalone server a failed journal write never strands a
claimed job. Store-specific: the rule differs by deployment, which the fake can stand for."""

from __future__ import annotations

from typing import Any

import pytest
from mongo_fakes import REPLICA_SET, FakeDB, FakeSession
from pymongo.errors import AutoReconnect

from leaseq.errors import StoreUnavailable
from leaseq.job import Lease
from leaseq.stores.mongodb import MongoStore, documents

Q, JOURNAL = "leaseq_q", "leaseq_journal"


def doc(job_id: str, **fields: Any) -> dict[str, Any]:
    return {"_id": job_id, "status": "processing", "attempts": 1, "max_attempts": 5,
            "lease_epoch": 1, "worker_id": "w", **fields}


@pytest.fixture
def replica() -> FakeDB:
    return FakeDB(dict(REPLICA_SET))


def test_on_a_replica_set_each_claim_commits_with_its_journal_entry(replica):
    # Given two claimable jobs on a deployment with transactions
    store = MongoStore(replica)
    replica[Q].answer("find", [{"_id": "a"}, {"_id": "b"}])
    replica[Q].answer("find_one_and_update", doc("a"), doc("b"))
    # When they are claimed
    jobs = store.claim("q", "w", 2, 60)
    # Then each claim and its entry went through one session, one transaction per job
    assert [j.id for j in jobs] == ["a", "b"]
    assert replica.client.transactions == ["start", "commit", "end_session"] * 2
    claims = replica.of(Q, "find_one_and_update")
    entries = replica.of(JOURNAL, "bulk_write")
    assert len(entries) == 2
    for (_, claim), (_, entry) in zip(claims, entries, strict=True):
        assert isinstance(claim["session"], FakeSession)
        assert entry["session"] is claim["session"]


def test_on_a_replica_set_a_failed_journal_write_aborts_the_claim(replica):
    # Given a journal write that fails
    store = MongoStore(replica)
    replica[JOURNAL].answer("bulk_write", AutoReconnect("primary stepped down"))
    replica[Q].answer("find_one_and_update", doc("a"))
    # When the job is claimed
    with pytest.raises(StoreUnavailable):
        store.claim_one("q", "a", "w", 60)
    # Then the transaction holding the claim was aborted (the claim never committed)
    assert replica.client.transactions == ["start", "abort", "end_session"]


def test_on_a_standalone_server_a_failed_journal_write_gives_the_claims_back(db, store):
    # Given two claimed jobs whose `claimed` entries cannot be written
    db[Q].answer("find", [{"_id": "a"}, {"_id": "b"}])
    db[Q].answer("find_one_and_update", doc("a", lease_epoch=4), doc("b", lease_epoch=1),
                 doc("a", status="pending", lease_epoch=4), doc("b", status="pending"))
    db[JOURNAL].answer("bulk_write", AutoReconnect("connection reset"))
    # When the worker claims
    with pytest.raises(StoreUnavailable):
        store.claim("q", "w", 2, 60)
    # Then both jobs were given back at once, fenced by their new epochs, attempts refunded,
    # instead of waiting out the lease the worker never saw and losing an attempt
    undo = [a for a, _ in db.of(Q, "find_one_and_update")][2:]
    back = documents.give_back(False, 0, 0)
    assert undo == [(documents.fenced(Lease("a", 4, "w"), stale=False), back),
                    (documents.fenced(Lease("b", 1, "w"), stale=False), back)]


def journal_events(db: FakeDB) -> list[tuple[str, str]]:
    return [(op._doc[0]["$set"]["job_id"]["$literal"], op._doc[0]["$set"]["event"]["$literal"])
            for args, _ in db.of(JOURNAL, "bulk_write") for op in args[0]]


def test_on_a_standalone_server_a_failure_mid_batch_gives_back_the_claims_made(db, store):
    # Given a batch whose second claim meets a dropped connection
    db[Q].answer("find", [{"_id": "a"}, {"_id": "b"}])
    db[Q].answer("find_one_and_update", doc("a", lease_epoch=2), AutoReconnect("reset"),
                 doc("a", status="pending", attempts=0, lease_epoch=2))
    with pytest.raises(StoreUnavailable):
        store.claim("q", "w", 2, 60)
    # Then the first job, claimed but never handed over, was given back and journalled so
    undo = [a for a, _ in db.of(Q, "find_one_and_update")][2]
    assert undo == (documents.fenced(Lease("a", 2, "w"), stale=False),
                    documents.give_back(False, 0, 0))
    assert journal_events(db) == [("a", "given_back")]


def test_on_a_replica_set_a_failure_mid_batch_gives_back_the_committed_claims(replica):
    # Given a batch whose second claim's transaction fails
    store = MongoStore(replica)
    replica[Q].answer("find", [{"_id": "a"}, {"_id": "b"}])
    replica[Q].answer("find_one_and_update", doc("a"), AutoReconnect("stepdown"),
                      doc("a", status="pending", attempts=0))
    with pytest.raises(StoreUnavailable):
        store.claim("q", "w", 2, 60)
    # Then the committed claim of the first was given back in a transaction of its own
    assert journal_events(replica) == [("a", "claimed"), ("a", "given_back")]
    assert replica.client.transactions == ["start", "commit", "end_session",
                                           "start", "abort", "end_session",
                                           "start", "commit", "end_session"]


def test_a_give_back_that_fails_too_still_raises_the_journal_error(db, store):
    # Given a store that fails after the claim, for the journal and the give-back alike
    db[Q].answer("find_one_and_update", doc("a"), AutoReconnect("down"))
    db[JOURNAL].answer("bulk_write", AutoReconnect("down"))
    # Then the caller sees the store is unavailable (the lease runs out; reclaim returns it)
    with pytest.raises(StoreUnavailable):
        store.claim_one("q", "a", "w", 60)
    assert len(db.of(Q, "find_one_and_update")) == 2


def test_on_a_replica_set_fail_and_its_quarantine_entry_commit_together(replica):
    store = MongoStore(replica)
    replica[Q].answer("find_one_and_update", doc("a", status="failed", failure="permanent"))
    store.fail("q", Lease("a", 1), "boom", "boom", "permanent")
    (_, change), = replica.of(Q, "find_one_and_update")
    (_, entry), = replica.of(JOURNAL, "bulk_write")
    assert entry["session"] is change["session"] is not None
    assert replica.client.transactions == ["start", "commit", "end_session"]


def test_on_a_standalone_server_a_finish_stands_when_its_entry_fails(db, store):
    # Given a fail whose quarantine entry cannot be written
    db[Q].answer("find_one_and_update", doc("a", status="failed", failure="permanent"))
    db[JOURNAL].answer("bulk_write", AutoReconnect("connection reset"))
    # Then the error is raised and nothing else is written: the job is already in its final
    # state, not held; the worker's next fenced write would say the lease is gone
    with pytest.raises(StoreUnavailable):
        store.fail("q", Lease("a", 1), "boom", "boom", "permanent")
    assert db.sequence(Q) == ["find_one_and_update"]
