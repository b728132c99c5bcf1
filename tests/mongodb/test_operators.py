"""The MongoDB store's operators' tools against the recording fake: the walks each filter
takes (every one indexed, see conftest.py), the filters checked on walked documents, and the
bulk paths the public-method table does not take."""

from __future__ import annotations

from datetime import UTC, datetime
from unittest import mock

import pytest
from mongo_fakes import REPLICA_SET, FakeDB
from pipeline_model import run

from leaseq.browse import BulkAction, JobFilter
from leaseq.errors import JobNotFound
from leaseq.stores.mongodb import MongoStore, documents
from leaseq.stores.mongodb.operators import edit_payload, matches, walk_query

Q = "leaseq_q"
AT = datetime(2024, 5, 1, 10, tzinfo=UTC)


def test_a_status_walk_goes_on_from_its_cursor(store: MongoStore, db: FakeDB) -> None:
    # Given a first page of one failed job
    db[Q].answer("find", [{"_id": "a", "updated_at": AT}, {"_id": "b", "updated_at": AT}],
                 [{"_id": "a", "status": "failed"}])
    page = store.find_jobs(JobFilter("q", status="failed"), limit=1)
    assert [j.id for j in page.jobs] == ["a"] and page.next_cursor
    # When the next page is read from its cursor
    db[Q].answer("find", [], [])
    assert store.find_jobs(JobFilter("q", status="failed"), cursor=page.next_cursor).jobs == []
    # Then the walk asked for what comes after (updated_at, id) of the last row
    query, sort = walk_query(JobFilter("q", status="failed"), AT.isoformat(), "a")
    assert query["$or"][1] == {"updated_at": AT, "_id": {"$lt": "a"}}
    assert sort == [("updated_at", -1), ("_id", -1)]


def test_an_id_prefix_is_one_range_of_the_id_index() -> None:
    query, _ = walk_query(JobFilter("q", id_prefix="ab"), None, None)
    assert query == {"_id": {"$gt": "", "$gte": "ab", "$lt": "ac"}}


def test_filters_the_index_does_not_bound() -> None:
    doc = {"_id": "ab-1", "task": "t", "error": "Timeout here", "updated_at": AT}
    assert matches(JobFilter("q", task="t", id_prefix="ab", error_text="timeout"), doc)
    assert not matches(JobFilter("q", task="u"), doc)
    assert not matches(JobFilter("q", id_prefix="x"), doc)
    assert not matches(JobFilter("q", error_text="nope"), doc)
    assert not matches(JobFilter("q", updated_from=datetime(2025, 1, 1, tzinfo=UTC)), doc)
    assert not matches(JobFilter("q", updated_until=AT), doc)
    assert matches(JobFilter("q", updated_until=datetime(2025, 1, 1, tzinfo=UTC)), doc)


def test_requeue_and_delete_act_only_where_they_fit(store: MongoStore, db: FakeDB) -> None:
    db[Q].answer("find_one_and_update", {"_id": "a", "status": "pending"}, None)
    result = store.act_on_jobs("q", BulkAction.REQUEUE, ["a", "b"], "me")
    assert (result.acted, result.skipped) == (["a"], ["b"])
    # Delete: found terminal, deleted, one of them still there (it went live in between)
    db[Q].answer("find", [{"_id": "a"}, {"_id": "b"}], [{"_id": "b"}])
    db[Q].answer("delete_many", mock.Mock(deleted_count=1))
    result = store.act_on_jobs("q", BulkAction.DELETE, ["a", "b", "c"], "me")
    assert (result.acted, result.skipped) == (["a"], ["b", "c"])
    db[Q].answer("find", [])
    assert store.act_on_jobs("q", BulkAction.DELETE, ["z"], "me").skipped == ["z"]


def test_requeue_edited_refuses_live_and_unknown_jobs(store: MongoStore, db: FakeDB) -> None:
    db[Q].answer("find_one_and_update", None, None)
    db[Q].answer("find_one", {"_id": "j1"}, None)
    assert store.requeue_edited("q", "j1", "{}", "me") is False
    with pytest.raises(JobNotFound):
        store.requeue_edited("q", "nope", "{}", "me")


NOW = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_an_edit_replaces_whatever_payload_the_job_holds_when_it_runs() -> None:
    # The edit is one update: a payload another revision wrote after the operator's read is
    # replaced whole too (a read-then-$unset kept the newer revision's fields beside the edit)
    failed = {"_id": "j", "status": "failed", "attempts": 3, "max_attempts": 3,
              "lease_epoch": 3, "revision": "r2", "b": 2, "nested": {"c": 1}}
    doc = run(edit_payload({"x": 1}, 0.0), failed, NOW)
    assert documents.payload_of(doc) == {"x": 1}
    assert (doc["_id"], doc["status"], doc["attempts"], doc["lease_epoch"], doc["revision"]) == \
        ("j", "pending", 0, 3, "r2")


def test_a_status_walk_goes_past_documents_without_updated_at(store: MongoStore,
                                                              db: FakeDB) -> None:
    # Given a page that ended on an adopted document with no updated_at
    db[Q].answer("find", [{"_id": "b"}], [{"_id": "b", "status": "failed"}])
    page = store.find_jobs(JobFilter("q", status="failed"), limit=1)
    assert page.next_cursor == '[null, "b"]'
    # Then the next page reads the other undated ones below it, and dated pages include them
    db[Q].answer("find", [], [])
    store.find_jobs(JobFilter("q", status="failed"), cursor=page.next_cursor)
    query, _ = walk_query(JobFilter("q", status="failed"), None, "b")
    assert query == {"status": "failed", "updated_at": None, "_id": {"$lt": "b"}}
    dated, _ = walk_query(JobFilter("q", status="failed"), AT.isoformat(), "a")
    assert {"updated_at": None} in dated["$or"]


def test_the_summarys_oldest_ready_age_is_the_oldest_whatever_its_priority(
        store: MongoStore, db: FakeDB) -> None:
    # Given ready jobs whose oldest by not-before (an hour) is not the first in claim order
    # (a fresh job of a higher priority): the ready aggregation answers the $min over all
    db[Q].answer("aggregate", [{"n": 7, "age_ms": 3_600_000}])
    # When the summary is read with a cap below the ready count
    summary = store.queue_summary("q", cap=5)
    # Then the age is the oldest ready job's, from the aggregation ready_stats reads (as the
    # SQL stores: by not-before, not by priority), and its count stops at the cap
    assert summary.oldest_ready_s == 3600.0
    assert (summary.ready.n, summary.ready.exact) == (5, False)
    assert db.of(Q, "aggregate")[0][0][0] == documents.ready(0)


def sessions_of(db: FakeDB, collection: str, method: str) -> list[object]:
    return [kwargs.get("session") for _, kwargs in db.of(collection, method)]


def test_on_a_replica_set_an_edit_and_its_journal_are_one_transaction() -> None:
    # Given a replica set and a failed job
    db = FakeDB(dict(REPLICA_SET))
    store = MongoStore(db)
    db[Q].answer("find_one_and_update", {"_id": "j", "status": "pending", "lease_epoch": 2})
    # When an operator edits and requeues it
    assert store.requeue_edited("q", "j", '{"x": 1}', "me") is True
    # Then the change and its two entries committed in one transaction: neither stands alone
    assert db.client.transactions == ["start", "commit", "end_session"]
    (change,) = sessions_of(db, Q, "find_one_and_update")
    assert change is not None and sessions_of(db, "leaseq_journal", "bulk_write") == [change]


def test_on_a_replica_set_each_job_of_a_bulk_action_commits_with_its_entry() -> None:
    # Given a replica set, one cancellable job and one that is not
    db = FakeDB(dict(REPLICA_SET))
    store = MongoStore(db)
    db[Q].answer("find_one_and_update", {"_id": "a", "status": "cancelled"}, None)
    # When an operator cancels both
    result = store.act_on_jobs("q", BulkAction.CANCEL, ["a", "b"], "me")
    # Then each job's change ran in a transaction of its own (one job's write conflict with
    # a worker cannot abort the others), the entry of the one cancelled in the same one
    assert (result.acted, result.skipped) == (["a"], ["b"])
    assert db.client.transactions == ["start", "commit", "end_session"] * 2
    first, second = sessions_of(db, Q, "find_one_and_update")
    assert None not in (first, second) and first is not second
    assert sessions_of(db, "leaseq_journal", "bulk_write") == [first]


def test_on_a_replica_set_a_bulk_delete_and_its_entries_are_one_transaction() -> None:
    # Given a replica set and two terminal jobs
    db = FakeDB(dict(REPLICA_SET))
    store = MongoStore(db)
    db[Q].answer("find", [{"_id": "a"}, {"_id": "b"}], [])
    db[Q].answer("delete_many", mock.Mock(deleted_count=2))
    # When an operator deletes them
    assert store.act_on_jobs("q", BulkAction.DELETE, ["a", "b"], "me").acted == ["a", "b"]
    # Then the batch's reads, its delete and its entries share one transaction
    assert db.client.transactions == ["start", "commit", "end_session"]
    shared = (sessions_of(db, Q, "find") + sessions_of(db, Q, "delete_many")
              + sessions_of(db, "leaseq_journal", "bulk_write"))
    assert len(shared) == 4 and shared[0] is not None
    assert all(session is shared[0] for session in shared)
