"""The MongoDB store's control flow against a recording fake (see mongo_fakes.py): which statement
it sends with which builder's document, in which order, and what it makes of the answer."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import pytest
from mongo_fakes import Deleted, FakeDB, Updated
from pymongo import ReadPreference, ReturnDocument
from pymongo.client_session import ClientSession
from pymongo.errors import OperationFailure, ServerSelectionTimeoutError

from leaseq.errors import (
    InvalidPayload,
    InvalidQueueName,
    JobConflict,
    JobNotFound,
    StoreUnavailable,
    UnsupportedOperation,
)
from leaseq.job import Completion, EnqueueOutcome, FollowUp, JobSpec, Lease, LeaseLost
from leaseq.journal import SPENT_WHILE_PENDING, STALE_REASON
from leaseq.stores.mongodb import MongoStore, documents, upserts

Q = "leaseq_q"
T0 = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)


def doc(job_id: str = "j1", **fields: Any) -> dict[str, Any]:
    base = {"_id": job_id, "status": "processing", "attempts": 1, "max_attempts": 5,
            "lease_epoch": 3, "worker_id": "w", "lease_until": T0, "updated_at": T0}
    return {**base, **fields}


def spec(job_id: str, payload: dict[str, Any], revision: str | None = None) -> JobSpec:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return JobSpec(job_id, payload, text, revision=revision)


def token_of(update: list[dict[str, Any]]) -> Any:
    """The ``moved_by`` token a ``documents.stamped`` update writes."""
    return update[-1]["$set"]["moved_by"]["$literal"]


def journal_events(db: FakeDB) -> list[tuple[str, str]]:
    events = []
    for args, _ in db.of("leaseq_journal", "bulk_write"):
        for op in args[0]:
            fields = op._doc[0]["$set"]
            events.append((fields["job_id"]["$literal"], fields["event"]["$literal"]))
    return events


# --- set-up --------------------------------------------------------------------------------


def test_indexes_are_made_once_per_queue_on_first_use(db, store):
    # Given a store with a TTL rule  When a queue is used twice
    store = MongoStore(db, ttl_s={"tombstone": 30 * 86400})
    store.get("q", "a")
    store.get("q", "b")
    # Then its indexes and its partial TTL index were created once
    created = [a[0] for a, _ in db.of(Q, "create_index")]
    assert created == [keys for keys, _ in documents.job_indexes({"tombstone": 1})]
    assert created[0] == [("status", 1), ("priority", -1), ("lease_until", 1), ("_id", 1)]
    ttl = db.of(Q, "create_index")[-1][1]
    assert ttl["partialFilterExpression"] == {"status": "tombstone"}


def test_an_equivalent_index_under_another_name_is_kept(db):
    # Given an adopted collection whose own TTL index matches ours under another name
    db[Q].answer("create_index", "ok", OperationFailure("exists", code=85))
    store = MongoStore(db, ttl_s={"tombstone": 60})
    # Then first use does not fail
    assert store.get("q", "a") is None


def test_a_changed_ttl_sets_the_new_lifetime_on_leaseqs_own_index(db):
    # Given a queue whose tombstones expired after a day, now configured for 30 days
    db[Q].answer("create_index", *["ok"] * 8,
                 OperationFailure("same name, other options", code=85))
    store = MongoStore(db, ttl_s={"tombstone": 30 * 86400})
    # When the queue is first used
    assert store.get("q", "a") is None
    # Then the index takes the lifetime configured now (MongoDB kept the old one)
    assert db.commands == [("collMod", (Q,), {"index": {
        "name": "leaseq_ttl_tombstone", "expireAfterSeconds": 30 * 86400}})]


def test_a_conflicting_ttl_index_of_another_name_is_kept(db):
    # Given an adopted collection whose own TTL index has the keys of ours under its name
    db[Q].answer("create_index", *["ok"] * 8, OperationFailure("other name", code=85))
    db.command_answers.append(OperationFailure("index not found", code=27))
    store = MongoStore(db, ttl_s={"tombstone": 60})
    # Then first use neither fails nor touches it
    assert store.get("q", "a") is None
    assert db.of(Q, "drop_index") == []


def test_a_status_taken_out_of_ttl_stops_expiring(db):
    # Given a queue that had TTL indexes for two statuses, now configured for one
    db[Q].answer("list_indexes", [{"name": "_id_"}, {"name": "leaseq_ttl_tombstone"},
                                  {"name": "leaseq_ttl_done"}, {"name": "ops_own_index"}])
    store = MongoStore(db, ttl_s={"tombstone": 60})
    # When the queue is first used
    store.get("q", "a")
    # Then leaseq's index of the other status is dropped, and nothing else
    assert [a for a, _ in db.of(Q, "drop_index")] == [("leaseq_ttl_done",)]


def test_a_ttl_change_the_server_refuses_is_logged_and_the_queue_goes_on(db, caplog):
    # Given a user allowed to create indexes but not to change or drop them
    db[Q].answer("create_index", *["ok"] * 8, OperationFailure("other options", code=85))
    db[Q].answer("list_indexes", [{"name": "leaseq_ttl_done"}])
    db[Q].answer("drop_index", OperationFailure("not authorized", code=13))
    db.command_answers.append(OperationFailure("not authorized", code=13))
    store = MongoStore(db, ttl_s={"tombstone": 60})
    # When the queue is first used, then it works, and the log says what was not changed
    with caplog.at_level("WARNING", logger="leaseq.stores.mongodb.store"):
        assert store.get("q", "a") is None
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "leaseq_ttl_tombstone its lifetime stays as it was (13)" in said
    assert "leaseq_ttl_done not dropped (13)" in said


def test_an_index_another_process_dropped_first_is_no_error(db):
    db[Q].answer("list_indexes", [{"name": "leaseq_ttl_done"}])
    db[Q].answer("drop_index", OperationFailure("index not found", code=27))
    assert MongoStore(db, ttl_s={}).get("q", "a") is None


def test_a_store_opened_without_ttl_leaves_the_ttl_indexes_alone(db):
    # Given a queue whose workers keep jobs for a day (their URL has ttl=done:86400)
    db[Q].answer("list_indexes", [{"name": "_id_"}, {"name": "leaseq_ttl_done"}])
    # When a producer whose URL says nothing of TTL first uses the queue
    assert MongoStore(db).get("q", "a") is None
    # Then it neither makes, changes nor drops a TTL index
    assert db.of(Q, "list_indexes") == [] and db.of(Q, "drop_index") == []
    assert not [o for a, o in db.of(Q, "create_index") if "expireAfterSeconds" in o]
    assert db.commands == []


def test_the_journal_collection_name_is_not_a_queue(store):
    with pytest.raises(InvalidQueueName):
        store.get("journal", "a")


def test_server_now_is_hello_local_time_plus_offset(store):
    store.time_offset_s = 90
    assert store.server_now() == T0 + timedelta(seconds=90)


def test_supports_transactions_follows_the_deployment():
    assert not MongoStore(FakeDB()).supports_transactions
    assert MongoStore(FakeDB({"setName": "rs0", "localTime": T0})).supports_transactions
    assert MongoStore(FakeDB({"msg": "isdbgrid", "localTime": T0})).supports_transactions


def test_drop_drops_only_this_prefix(db, store):
    db.names = ["leaseq_q", "leaseq_journal"]
    store.drop()
    assert db.dropped == ["leaseq_q", "leaseq_journal"]


# --- claim ---------------------------------------------------------------------------------


def test_claim_reads_the_candidates_once_then_claims_each_by_id(db, store):
    # Given two claimable jobs, the second claimed before (epoch 1)
    db[Q].answer("find", [{"_id": "a"}, {"_id": "b"}])
    db[Q].answer("find_one_and_update", doc("a", attempts=1, lease_epoch=1),
                 doc("b", attempts=1, lease_epoch=2))
    # When up to five are claimed
    jobs = store.claim("q", "w", 5, 900)
    # Then one indexed read in claim order found them (no scan per job)
    (read_args, read_kwargs), = db.of(Q, "find")
    assert read_args == (documents.claimable(0), {"_id": 1})
    assert read_kwargs == {"sort": documents.CLAIM_SORT, "limit": 5}
    # And each was claimed by its id with the whole claimable guard
    calls = db.of(Q, "find_one_and_update")
    assert [j.id for j in jobs] == ["a", "b"]
    # under the call's one claim token
    token = calls[0][0][1][0]["$set"]["claim_token"]["$literal"]
    assert re.fullmatch("[0-9a-f]{32}", token)
    claim = documents.claim("w", 900, 0, token)
    assert [c[0] for c in calls] == [(documents.claimable_id("a", 0), claim),
                                     (documents.claimable_id("b", 0), claim)]
    assert calls[0][1]["return_document"] == ReturnDocument.AFTER
    # And both claims are journalled in one round trip, the second as a redelivery
    assert journal_events(db) == [("a", "claimed"), ("b", "claimed")]
    ops = db.of("leaseq_journal", "bulk_write")[0][0][0]
    assert [op._doc[0]["$set"]["reason"] for op in ops] == [
        {"$literal": None}, {"$literal": "redelivered"}]


def test_claim_stops_reading_once_it_took_some(db, store):
    # Given three candidates of which another worker took the first two in between
    db[Q].answer("find", [{"_id": "a"}, {"_id": "b"}, {"_id": "c"}])
    db[Q].answer("find_one_and_update", None, None, doc("c"))
    # Then the claim returns the one it got without reading again
    assert [j.id for j in store.claim("q", "w", 3, 60)] == ["c"]
    assert db.sequence(Q) == ["find"] + ["find_one_and_update"] * 3


def test_claim_reads_again_when_other_workers_took_every_candidate(db, store):
    # Given a first read whose candidates were all taken by others, then a fresh one
    db[Q].answer("find", [{"_id": "a"}, {"_id": "b"}], [{"_id": "c"}])
    db[Q].answer("find_one_and_update", None, None, doc("c"))
    # Then the claim reads again (an empty answer means nothing was claimable)
    assert [j.id for j in store.claim("q", "w", 2, 60)] == ["c"]
    assert [k["limit"] for _, k in db.of(Q, "find")] == [2, 2]


def test_redelivered_follows_the_epoch_not_the_refunded_attempts(db, store):
    # Given a job given back twice: attempts back to 1, but its third claim (epoch 3)
    db[Q].answer("find_one_and_update", doc("a", attempts=1, lease_epoch=3))
    store.claim_one("q", "a", "w", 60)
    op = db.of("leaseq_journal", "bulk_write")[0][0][0][0]
    assert op._doc[0]["$set"]["reason"] == {"$literal": "redelivered"}


def test_claim_that_finds_nothing_writes_no_journal(db, store):
    assert store.claim("q", "w", 3, 900) == []
    assert db.of("leaseq_journal", "bulk_write") == []


def test_claim_one_filters_on_the_id(db, store):
    assert store.claim_one("q", "x", "w", 60) is None
    assert db.of(Q, "find_one_and_update")[0][0][0] == documents.claimable_id("x", 0)


# --- heartbeat -----------------------------------------------------------------------------


def test_heartbeat_with_every_lease_held_is_one_statement(db, store):
    db[Q].answer("update_many", Updated(2))
    assert store.heartbeat_many("q", [Lease("a", 1), Lease("b", 2)], 60) == []
    assert db.sequence(Q) == ["update_many"]
    args, _ = db.of(Q, "update_many")[0]
    assert args == (documents.held([Lease("a", 1), Lease("b", 2)]), documents.extend(60, 0))


def test_heartbeat_names_the_lost_leases_in_order_and_journals_existing_ones(db, store):
    # Given a held, a re-claimed and a deleted job
    db[Q].answer("update_many", Updated(1))
    db[Q].answer("find", [doc("a", lease_epoch=1), doc("b", lease_epoch=9)])
    lost = store.heartbeat_many("q", [Lease("c", 1), Lease("a", 1), Lease("b", 2)], 60)
    # Then the lost ones come back in the given order; only the existing one is journalled
    assert lost == ["c", "b"]
    assert journal_events(db) == [("b", "heartbeat_lost")]


def test_a_lost_lease_already_journaled_is_not_journaled_again(db, store):
    # Given two lost leases, the loss of b's lease at epoch 2 already journaled (an earlier
    # beat), and a's at another epoch only
    db[Q].answer("update_many", Updated(0))
    db[Q].answer("find", [doc("a", lease_epoch=3), doc("b", lease_epoch=9)])
    db["leaseq_journal"].answer("find", [
        {"job_id": "b", "event": "heartbeat_lost", "lease_epoch": 2},
        {"job_id": "a", "event": "heartbeat_lost", "lease_epoch": 1},
        {"job_id": "a", "event": "claimed", "lease_epoch": 2}])
    # When they beat again
    lost = store.heartbeat_many("q", [Lease("a", 2), Lease("b", 2)], 60)
    # Then both are lost, and only a's loss at epoch 2 is journaled, once
    assert lost == ["a", "b"]
    assert journal_events(db) == [("a", "heartbeat_lost")]
    ((args, _),) = db.of("leaseq_journal", "find")
    assert args[0] == documents.journals_of("q", ["a", "b"])


def test_heartbeat_of_a_job_enqueued_again_and_claimed_by_another_worker_is_lost(db, store):
    # Given a job deleted while W1 ran it, enqueued again and claimed by W2 at the same epoch
    db[Q].answer("update_many", Updated(0))
    db[Q].answer("find", [doc("a", lease_epoch=1, worker_id="w2")])
    # Then W1's lease is not held: the epoch matches, the worker does not
    assert store.heartbeat_many("q", [Lease("a", 1, "w1")], 60) == ["a"]
    assert journal_events(db) == [("a", "heartbeat_lost")]


def test_heartbeat_of_a_job_enqueued_again_and_claimed_by_the_same_worker_is_lost(db, store):
    # Given a job deleted while W1 ran it, enqueued again and claimed by W1 again at the same
    # epoch: one document matches the two leases' filter, the new claim's
    db[Q].answer("update_many", Updated(1))
    db[Q].answer("find", [doc("a", lease_epoch=1, worker_id="w1", claim_token="new")])
    old, new = Lease("a", 1, "w1", "old"), Lease("a", 1, "w1", "new")
    # Then the count is short of the leases, and only the old claim's lease is lost
    assert store.heartbeat_many("q", [old, new], 60) == ["a"]
    db[Q].answer("update_many", Updated(1))
    assert store.heartbeat_many("q", [new, new], 60) == []  # the same lease twice: held
    assert db.sequence(Q) == ["update_many", "find", "update_many"]


def test_a_claimed_job_carries_its_claims_token_into_its_lease(db, store):
    db[Q].answer("find", [{"_id": "a"}])
    db[Q].answer("find_one_and_update", doc("a", attempts=1, lease_epoch=1, worker_id="w",
                                            claim_token="t9"))
    (job,) = store.claim("q", "w", 1, 900)
    assert job.lease == Lease("a", 1, "w", "t9")


# --- fenced finishes -----------------------------------------------------------------------


def test_complete_writes_the_fenced_finish(db, store):
    db[Q].answer("find_one_and_update", doc(status="done", result='{"n":1}'))
    job = store.complete("q", Lease("j1", 3), '{"n":1}')
    args, kwargs = db.of(Q, "find_one_and_update")[0]
    assert args == (documents.fenced(Lease("j1", 3), stale=False),
                    documents.complete("done", '{"n":1}', None, 0))
    assert kwargs["return_document"] == ReturnDocument.AFTER
    assert job.status == "done" and job.result == {"n": 1}
    assert journal_events(db) == [("j1", "result_saved")]


FINISHES = {
    "complete": lambda s: s.complete("q", Lease("j1", 3), None),
    "complete_many": lambda s: s.complete_many("q", [Completion(Lease("j1", 3))])[0],
    "retry_later": lambda s: s.retry_later("q", Lease("j1", 3), "e", "e", 30),
    "fail": lambda s: s.fail("q", Lease("j1", 3), "boom", "boom", "permanent"),
    "snooze": lambda s: s.snooze("q", Lease("j1", 3), 5),
    "give_back": lambda s: s.give_back("q", Lease("j1", 3), True, "shutdown"),
}


@pytest.mark.parametrize("finish", sorted(FINISHES))
def test_a_stale_job_is_given_back_afresh_instead_of_finished(db, store, finish):
    # Given a job whose payload got a new revision while it ran
    db[Q].answer("find_one_and_update", None, doc(status="pending", attempts=0))
    # When its worker finishes it in any way
    job = FINISHES[finish](store)
    # Then the second, stale-only statement gave it back: attempts and counters reset
    second = db.of(Q, "find_one_and_update")[1][0]
    assert second == (documents.fenced(Lease("j1", 3), stale=True), documents.stale_give_back(0))
    assert job.status == "pending"
    assert journal_events(db) == [("j1", "given_back")]
    fields = db.of("leaseq_journal", "bulk_write")[0][0][0][0]._doc[0]["$set"]
    assert fields["reason"] == {"$literal": STALE_REASON}


def test_a_lost_lease_raises_and_writes_nothing_else(db, store):
    spec_ = spec("next", {"a": 1})
    with pytest.raises(LeaseLost):
        store.complete("q", Lease("j1", 3), None, then=[FollowUp("q", [spec_])])
    assert db.sequence(Q) == ["find_one_and_update", "find_one_and_update"]
    assert db.of("leaseq_journal", "bulk_write") == []


def test_complete_then_enqueues_follow_ups_after_the_finish(db, store):
    db[Q].answer("find_one_and_update", doc(status="done"), None)
    store.complete("q", Lease("j1", 3), None, then=[FollowUp("q", [spec("next", {"a": 1})])])
    upsert = db.of(Q, "find_one_and_update")[1]
    assert upsert[0][0] == {"_id": "next"} and upsert[1]["upsert"] is True
    assert journal_events(db) == [("j1", "result_saved"), ("next", "enqueued")]


def test_retry_later_on_the_last_attempt_is_quarantined(db, store):
    db[Q].answer("find_one_and_update", doc(status="failed", failure="exhausted", attempts=5))
    job = store.retry_later("q", Lease("j1", 3), "err", "err", 30)
    assert job.failure == "exhausted"
    assert journal_events(db) == [("j1", "quarantined")]


def test_snooze_is_fenced_and_counted_against_the_bound(db, store):
    with pytest.raises(LeaseLost):
        store.snooze("q", Lease("j1", 3), 5, max_snoozes=7)
    first = db.of(Q, "find_one_and_update")[0][0]
    assert first == (documents.fenced(Lease("j1", 3), stale=False), documents.snooze(5, 7, 0))


def test_a_snooze_past_the_bound_is_quarantined_with_its_count(db, store):
    db[Q].answer("find_one_and_update", doc(status="failed", failure="exhausted", snoozes=201,
                                            error="snoozed 201 times without finishing"))
    job = store.snooze("q", Lease("j1", 3), 5)
    assert (job.status, job.failure) == ("failed", "exhausted")
    assert journal_events(db) == [("j1", "quarantined")]
    fields = db.of("leaseq_journal", "bulk_write")[0][0][0][0]._doc[0]["$set"]
    assert fields["reason"] == {"$literal": "exhausted: snoozed 201 times without finishing"}


def test_a_snooze_within_the_bound_is_journalled_as_snoozed(db, store):
    db[Q].answer("find_one_and_update", doc(status="pending", snoozes=1, attempts=0))
    job = store.snooze("q", Lease("j1", 3), 5, reason="waiting for the disk")
    assert job.status == "pending"
    assert journal_events(db) == [("j1", "snoozed")]


@pytest.mark.parametrize("started", [False, True])
def test_give_back_is_fenced_and_journalled(db, store, started):
    db[Q].answer("find_one_and_update", doc(status="pending", attempts=0, givebacks=int(started)))
    job = store.give_back("q", Lease("j1", 3), started, "worker shutting down", max_givebacks=2)
    first = db.of(Q, "find_one_and_update")[0][0]
    assert first == (documents.fenced(Lease("j1", 3), stale=False),
                     documents.give_back(started, 2, 0))
    assert job.status == "pending"
    assert journal_events(db) == [("j1", "given_back")]
    fields = db.of("leaseq_journal", "bulk_write")[0][0][0][0]._doc[0]["$set"]
    assert fields["data"] == {"$literal": {"started": started}}


def test_a_give_back_past_the_bound_with_attempts_spent_is_quarantined(db, store):
    db[Q].answer("find_one_and_update", doc(
        status="failed", failure="exhausted", attempts=5, givebacks=3,
        error="given back 3 times while its handler ran; its attempts are spent"))
    job = store.give_back("q", Lease("j1", 3), True, "worker shutting down")
    assert job.failure == "exhausted"
    assert journal_events(db) == [("j1", "quarantined")]


def test_give_back_of_a_lost_lease_raises(db, store):
    with pytest.raises(LeaseLost):
        store.give_back("q", Lease("j1", 3), False, "shutdown")
    assert db.of("leaseq_journal", "bulk_write") == []


# --- reclaim, purge, outbox ----------------------------------------------------------------


def test_reclaim_buries_spent_jobs_before_returning_the_others_then_fails_spent_pending(
        db, store):
    db[Q].answer("find", [doc("spent", attempts=5)], [doc("live")],
                 [doc("old", status="pending", attempts=3, max_attempts=2)])
    db[Q].answer("update_many", Updated(1), Updated(1), Updated(1))
    assert store.reclaim_expired("q") == (2, 1)
    first, second, third = (a for a, _ in db.of(Q, "update_many"))
    tokens = [token_of(update) for _, update in (first, second, third)]
    assert first == ({**documents.expired(0, spent_=True), "_id": {"$in": ["spent"]}},
                     documents.stamped(documents.expire_spent(0), tokens[0]))
    assert second == ({**documents.expired(0, spent_=False), "_id": {"$in": ["live"]}},
                      documents.stamped(documents.return_expired(0), tokens[1]))
    assert third == ({**documents.pending_spent(), "_id": {"$in": ["old"]}},
                     documents.stamped(documents.exhaust_pending(0), tokens[2]))
    assert len(set(tokens)) == 3  # each update_many its own
    assert journal_events(db) == [("spent", "quarantined"), ("live", "reclaimed"),
                                  ("old", "quarantined")]
    reasons = [op._doc[0]["$set"]["reason"]["$literal"]
               for args, _ in db.of("leaseq_journal", "bulk_write") for op in args[0]]
    # the same words as the SQL stores' (leaseq.journal)
    assert reasons[2] == SPENT_WHILE_PENDING == "exhausted: attempts spent while pending"


def test_reclaim_says_when_a_stale_job_came_back_afresh(db, store):
    db[Q].answer("find", [], [doc("s", stale=True)], [])
    db[Q].answer("update_many", Updated(1))
    assert store.reclaim_expired("q") == (0, 1)
    op = db.of("leaseq_journal", "bulk_write")[0][0][0][0]
    assert op._doc[0]["$set"]["reason"] == {
        "$literal": "lease expired; stale revision, attempts reset"}


def test_reclaim_journals_only_what_it_moved_when_a_worker_raced_it(db, store):
    # Given two expired jobs of which one is re-claimed between the read and the update
    db[Q].answer("find", [], [doc("a"), doc("b")], [{"_id": "a"}])
    db[Q].answer("update_many", Updated(1))
    assert store.reclaim_expired("q") == (0, 1)
    assert journal_events(db) == [("a", "reclaimed")]
    # Then the second read asked which of them this update_many stamped
    (_, update), = [a for a, _ in db.of(Q, "update_many")]
    assert db.of(Q, "find")[2][0][0] == documents.stamped_by(["a", "b"], token_of(update))


def test_mark_published_counts_what_it_marked(db, store):
    db[Q].answer("find", [doc("a", status="pending")])
    db[Q].answer("update_many", Updated(1))
    assert store.mark_published("q", [Lease("a", 0), Lease("b", 3)]) == ["a"]
    update = db.of(Q, "update_many")[0][0][1]
    assert update == documents.stamped(documents.mark_published(0), token_of(update))


def test_purge_deletes_jobs_and_their_journal(db, store):
    db[Q].answer("find", [{"_id": "a"}, {"_id": "b"}], [{"_id": "b"}], [])
    db[Q].answer("delete_many", Deleted(1))
    assert store.purge("q", {"done": 60}) == 1
    journal = db.of("leaseq_journal", "delete_many")[0][0][0]
    assert journal == {"queue": "q", "job_id": {"$in": ["a"]}}  # b survived: keep its journal


def test_on_a_replica_set_each_purge_batch_and_its_journal_are_one_transaction():
    # Given a replica set and two old done jobs, one of which went live again meanwhile
    db = FakeDB({"setName": "rs0", "localTime": T0})
    store = MongoStore(db)
    db[Q].answer("find", [{"_id": "a"}, {"_id": "b"}], [{"_id": "b"}], [])
    db[Q].answer("delete_many", Deleted(1))
    # When they are purged
    assert store.purge("q", {"done": 60}) == 1
    # Then the batch's delete, the read of what is left and the journal's delete committed
    # together (as on the SQL stores): no job is gone with its story left, nor the reverse
    assert db.client.transactions == ["start", "commit", "end_session"]
    batch = [db.of(Q, "delete_many")[0], db.of(Q, "find")[1],
             db.of("leaseq_journal", "delete_many")[0]]
    session = batch[0][1]["session"]
    assert session is not None and all(kwargs["session"] is session for _, kwargs in batch)


# --- operators -----------------------------------------------------------------------------


def test_operator_requeue_of_a_missing_job_raises(store):
    with pytest.raises(JobNotFound):
        store.requeue("q", "nope")


def test_operator_cancel_of_a_done_job_is_false(db, store):
    db[Q].answer("find_one", {"_id": "x"})
    assert store.cancel("q", "x") is False
    assert db.of(Q, "find_one_and_update")[0][0][0] == documents.cancellable("x")


def replica_set() -> tuple[FakeDB, Any, MongoStore]:
    """A store on a replica set whose every transaction runs in one session, returned."""
    db = FakeDB({"setName": "rs0", "localTime": T0})
    session = mock.MagicMock()
    session.with_transaction.side_effect = lambda work, **_: work(session)
    db.client = mock.MagicMock()
    db.client.start_session.return_value.__enter__.return_value = session
    return db, session, MongoStore(db)


def test_on_a_replica_set_an_operators_change_and_its_journal_are_one_transaction():
    # Given a replica set, and a cancellable job
    db, session, store = replica_set()
    db[Q].answer("find_one_and_update", {"_id": "x", "attempts": 1, "lease_epoch": 2})
    # When an operator cancels it, Then the change and its journal entry share a
    # transaction: one cannot stand without the other
    assert store.cancel("q", "x") is True
    assert session.with_transaction.called
    assert db.of(Q, "find_one_and_update")[0][1]["session"] is session
    assert db.of("leaseq_journal", "bulk_write")[0][1]["session"] is session


# --- enqueue -------------------------------------------------------------------------------


def test_enqueue_outcomes_come_from_the_pre_image(db, store):
    db[Q].answer("find", [])
    db[Q].answer("find_one_and_update", None, {"_id": "a", "status": "pending", "x": 1})
    results = store.enqueue_many("q", [spec("a", {"x": 1}), spec("a", {"x": 1})])
    assert [r.outcome for r in results] == [EnqueueOutcome.CREATED, EnqueueOutcome.UNCHANGED]
    args, kwargs = db.of(Q, "find_one_and_update")[0]
    assert args[0] == {"_id": "a"}
    assert args[1] == upserts.upsert({"x": 1}, None, None, 5, 0.0, "raise", 0)
    assert kwargs["upsert"] is True and kwargs["return_document"] == ReturnDocument.BEFORE
    assert journal_events(db) == [("a", "enqueued")]


@pytest.mark.parametrize("payload", [{"n": 2**63}, {"deep": [{"n": -(2**63) - 1}]}], ids=repr)
def test_an_integer_wider_than_bson_is_invalid_payload_before_any_write(db, store, payload):
    # Given a batch whose second job holds an integer beyond 8 bytes (SQL stores take it)
    with pytest.raises(InvalidPayload, match="8 bytes"):
        store.enqueue_many("q", [spec("a", {"x": 1}), spec("b", payload)])
    # Then nothing was written (pymongo raised a bare OverflowError at the second write)
    assert db.sequence(Q) == []


def test_a_follow_up_with_an_integer_wider_than_bson_is_invalid_payload_before_any_write(
        db, store):
    # Given a finished handler whose follow-up job holds an integer beyond 8 bytes
    with pytest.raises(InvalidPayload, match="8 bytes"):
        store.complete("q", Lease("j1", 3), None,
                       then=[FollowUp("q", [spec("next", {"n": 2**64})])])
    # Then nothing was written: not the job's finish (on a server without transactions it
    # stood, done, and the follow-up was lost), and the runner can quarantine the job
    assert db.sequence(Q) == []


def test_integers_that_fit_and_long_digit_strings_are_taken(db, store):
    db[Q].answer("find", [])
    db[Q].answer("find_one_and_update", None, None)
    results = store.enqueue_many("q", [spec("a", {"n": 2**63 - 1, "m": -(2**63)}),
                                       spec("b", {"s": "1" * 40, "t": True})])
    assert [r.outcome for r in results] == [EnqueueOutcome.CREATED] * 2


def test_a_conflicting_batch_writes_nothing_without_transactions(db, store):
    # Given a stored job and a batch whose second spec changes its payload without a revision
    db[Q].answer("find", [{"_id": "b", "status": "done", "x": 1}])
    with pytest.raises(JobConflict) as raised:
        store.enqueue_many("q", [spec("a", {"x": 1}), spec("b", {"x": 2})])
    # Then the conflict is found by the read before any write
    assert raised.value.job_ids == ["b"]
    assert db.sequence(Q) == ["find"]


def test_keep_reports_a_conflict_and_the_pipeline_does_not_write_it(db, store):
    db[Q].answer("find_one_and_update", {"_id": "b", "status": "done", "x": 1})
    results = store.enqueue_many("q", [spec("b", {"x": 2})], on_conflict="keep")
    assert results[0].outcome is EnqueueOutcome.CONFLICT
    op = db.of(Q, "find_one_and_update")[0][0][1][0]["$replaceWith"]["$let"]["vars"]["op"]
    assert op["$switch"]["branches"][1]["case"] is False


def test_enqueue_in_a_callers_session_on_a_standalone_server_is_refused(store):
    session = mock.MagicMock(spec=ClientSession)
    with pytest.raises(UnsupportedOperation, match="replica set"):
        store.enqueue_many("q", [spec("a", {"x": 1})], connection=session)


def test_enqueue_in_a_callers_transaction_writes_through_it():
    db = FakeDB({"setName": "rs0", "localTime": T0})
    store = MongoStore(db)
    session = mock.MagicMock(spec=ClientSession, in_transaction=True)
    store.enqueue_many("q", [spec("a", {"x": 1})], connection=session)
    assert db.of(Q, "find_one_and_update")[0][1]["session"] is session
    assert db.of("leaseq_journal", "bulk_write")[0][1]["session"] is session


def test_a_conflict_in_a_callers_transaction_is_found_before_any_write():
    # Given a replica set, a caller's transaction, and a stored job the batch's second spec
    # would change without a revision
    db = FakeDB({"setName": "rs0", "localTime": T0})
    store = MongoStore(db)
    session = mock.MagicMock(spec=ClientSession, in_transaction=True)
    db[Q].answer("find", [{"_id": "b", "status": "done", "x": 1}])
    # When the batch is enqueued through the caller's session
    with pytest.raises(JobConflict) as raised:
        store.enqueue_many("q", [spec("a", {"x": 1}), spec("b", {"x": 2})],
                           connection=session)
    # Then the conflict was found by a read in that session, and nothing was written in it:
    # a caller that catches JobConflict and commits keeps none of the batch
    assert raised.value.job_ids == ["b"]
    assert db.sequence(Q) == ["find"]
    assert db.of(Q, "find")[0][1]["session"] is session
    assert db.of("leaseq_journal", "bulk_write") == []


def test_on_a_replica_set_a_batch_runs_in_one_transaction():
    db, session, store = replica_set()
    store.enqueue_many("q", [spec("a", {"x": 1})])
    assert session.with_transaction.called
    assert db.of(Q, "find_one_and_update")[0][1]["session"] is session
    assert db.sequence(Q) == ["find_one_and_update"]  # no pre-read: the transaction rolls back


# --- errors --------------------------------------------------------------------------------


def test_connection_errors_become_store_unavailable_with_the_password_masked(db, store):
    db[Q].answer("find_one", ServerSelectionTimeoutError("auth u:s3cret@db.example failed"))
    with pytest.raises(StoreUnavailable) as raised:
        store.get("q", "a")
    assert "s3cret" not in str(raised.value) and "***" in str(raised.value)


def test_a_transaction_on_a_standalone_server_becomes_unsupported(db, store):
    db[Q].answer("find_one", OperationFailure("Transaction numbers are only allowed", code=20))
    with pytest.raises(UnsupportedOperation, match="standalone"):
        store.get("q", "a")


# --- inspection ----------------------------------------------------------------------------


def test_ready_stats_reads_the_ready_count_and_oldest_age_in_one_aggregation(db, store):
    # Given the server's answer for three ready jobs, the oldest ready for 90 s
    db[Q].answer("aggregate", [{"n": 3, "age_ms": 90_000}])
    # When the autoscaler's numbers are read
    # Then they come back (issue 11, 7: a set named _ready hid this method: TypeError)
    assert store.ready_stats("q") == (3, 90.0)
    (args, _), = db.of(Q, "aggregate")
    assert args == (documents.ready(0),)


def test_ready_and_oldest_age_derive_from_ready_stats(db, store):
    db[Q].answer("aggregate", [], [{"n": 1, "age_ms": -5}])
    assert store.ready("q") == 0  # no ready job: (0, 0.0)
    assert store.oldest_pending_age_s("q") == 0.0  # a clock step back never goes negative


def test_in_flight_counts_processing_jobs_with_a_live_lease(db, store):
    db[Q].answer("count_documents", 4)
    assert store.in_flight("q") == 4
    (args, _), = db.of(Q, "count_documents")
    assert args == (documents.in_flight(0),)


def test_a_job_shows_its_counters_and_reads_absent_ones_as_zero(db, store):
    db[Q].answer("find_one", doc(snoozes=2, givebacks=1), {"_id": "old", "status": "pending"})
    job = store.get("q", "j1")
    assert (job.snoozes, job.givebacks) == (2, 1)
    adopted = store.get("q", "old")
    assert (adopted.snoozes, adopted.givebacks, adopted.payload) == (0, 0, {})


def test_every_read_goes_to_the_primary_whatever_the_url_says(db, store):
    # The store's reads decide its writes: a lagging secondary would offer jobs already taken
    store.claim("q", "w", 1, 60)
    store.journal("q", "a")
    assert db[Q].options == {"read_preference": ReadPreference.PRIMARY}
    assert db["leaseq_journal"].options == {"read_preference": ReadPreference.PRIMARY}
