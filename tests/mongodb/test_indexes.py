"""The ESR rule (``indexes.unserved``) as a pure function, and every query builder of the store
checked with it against the store's indexes (issue 11, 7: the claim sorted on
``lease_until, _id`` while the only index was ``{status, lease_until}``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from leaseq.job import Lease
from leaseq.stores.mongodb import documents, indexes, operators

JOBS = [keys for keys, _ in indexes.job_indexes({"tombstone": 60})]
OLD_INDEX = [("status", 1), ("lease_until", 1)]


# --- the rule ------------------------------------------------------------------------------


def test_equality_then_sort_then_range_is_served():
    query = {"status": "done", "updated_at": {"$gt": 1}}
    index = [("status", 1), ("_id", 1), ("updated_at", 1)]
    assert indexes.unserved(query, [("_id", 1)], [index]) == []


def test_a_range_before_the_sort_is_not_served():
    # the index would be read by updated_at, so the _id order needs a blocking sort
    query = {"status": "done", "updated_at": {"$gt": 1}}
    assert indexes.unserved(query, [("_id", 1)], [[("status", 1), ("updated_at", 1), ("_id", 1)]])


def test_a_range_on_the_first_sort_key_is_served_by_the_sort():
    query = {"status": "pending", "lease_until": {"$type": "date"}}
    assert indexes.unserved(query, documents.CLAIM_SORT, [indexes.CLAIM_INDEX]) == []


def test_an_index_read_backwards_serves_the_reversed_sort():
    query = {"status": "pending"}
    assert indexes.unserved(query, [("_id", -1)], [[("status", 1), ("_id", 1)]]) == []
    mixed = [("lease_until", 1), ("_id", -1)]
    assert indexes.unserved(query, mixed, [indexes.CLAIM_INDEX])


def test_every_equality_field_must_lead_the_index():
    query = {"status": "pending", "published_at": None}
    # published_at would be read and dropped
    assert indexes.unserved(query, [], [indexes.CLAIM_INDEX])
    assert indexes.unserved(query, [], [[("lease_until", 1), ("status", 1)]])
    assert indexes.unserved(query, [], [indexes.OUTBOX_INDEX]) == []


def test_a_range_field_missing_from_the_index_is_not_served():
    query = {"status": "done", "updated_at": {"$lt": 5}}
    assert indexes.unserved(query, [], [indexes.LISTING_INDEX])


def test_an_or_is_served_only_when_every_branch_is():
    query = {"$or": [{"status": "pending"}, {"published_at": {"$type": "date"}}]}
    missing = indexes.unserved(query, [], [indexes.CLAIM_INDEX])
    assert missing == [[("published_at", {"$type": "date"})]]


def test_conditions_around_an_or_and_inside_and_join_every_branch():
    query = {"status": "pending", "$and": [{"$or": [{"a": 1}, {"b": 2}]}],
             "$or": [{"c": 3}, {"d": 4}]}
    found = indexes.branches(query)
    assert len(found) == 4
    assert all(("status", "pending") in branch for branch in found)


def test_an_id_equality_is_served_by_the_id_index():
    assert indexes.unserved({"_id": "a", "status": "processing", "lease_epoch": 3}, [], []) == []
    assert indexes.unserved({"_id": {"$in": ["a", "b"]}, "x": 1}, [], []) == []


def test_expr_comparisons_with_a_constant_are_ranges_and_field_pairs_are_left_to_the_fetch():
    clock = documents.now(0)
    equal, ranged = indexes.classify([("$expr", {"$and": [
        {"$lte": ["$lease_until", clock]}, {"$lt": ["$attempts", "$max_attempts"]},
        {"$eq": ["$status", {"$literal": "$x"}]}]})])
    assert (equal, ranged) == ({"status"}, {"lease_until"})
    assert indexes.classify([("$expr", {"$or": [{"$lt": ["$a", 1]}]})]) == (set(), set())
    assert indexes.classify([("$expr", "$flag")]) == (set(), set())


def test_negations_and_existence_bound_nothing():
    branch = [("stale", {"$ne": True}), ("s", {"$nin": [1]}), ("e", {"$exists": False})]
    assert indexes.classify(branch) == (set(), set())


def test_an_empty_filter_needs_no_index():
    assert indexes.unserved({}, [], []) == []


def test_index_names_are_mongodbs_defaults():
    assert indexes.name_of(OLD_INDEX) == "status_1_lease_until_1"
    assert indexes.name_of(indexes.CLAIM_INDEX) == "status_1_priority_-1_lease_until_1__id_1"


# --- the store's queries -------------------------------------------------------------------


def test_the_old_index_did_not_serve_the_claim():
    # The defect: {status, lease_until} leaves the _id order to a blocking sort of every due job
    assert indexes.unserved(documents.claimable(0), documents.CLAIM_SORT, [OLD_INDEX])


QUERIES = {
    "claim": (documents.claimable(0), documents.CLAIM_SORT),
    "claim_one": (documents.claimable_id("j", 0), []),
    "claim of one key": (documents.claimable_keyed("k", 0), documents.CLAIM_SORT),
    "key counts": (documents.key_counts(0)[0]["$match"], []),
    "keys running": (documents.keys_running(["a", "b"])[0]["$match"], []),
    # The key walk's keys: KEYED_INDEX must hold them in key order right after the status
    # (what lets the server answer the $group with one seek per key).
    "pending keys": (documents.pending_keys()[0]["$match"], [("concurrency_key", 1)]),
    "processing key counts": (documents.key_counts(0, processing_only=True)[0]["$match"], []),
    "ready": (documents.ready(0)[0]["$match"], []),
    "in_flight": (documents.in_flight(0), []),
    "lapsed": (documents.lapsed(0), []),
    "outbox_due": (documents.outbox_due(0), documents.OUTBOX_SORT),
    "republish": (documents.published_before(60, 0), []),
    "mark_published": (documents.unpublished([("a", 0), ("b", 2)], 0), []),
    "mark_published as of a read": (
        documents.unpublished([("a", 0)], 0, datetime(2026, 1, 1, tzinfo=UTC)), []),
    "reclaim step 1": (documents.expired(0, spent_=True), []),
    "reclaim step 2": (documents.expired(0, spent_=False), []),
    "reclaim step 3": (documents.pending_spent(), []),
    "fenced": (documents.fenced(Lease("j", 1), stale=True), []),
    "heartbeat": (documents.held([Lease("a", 1)]), []),
    "retry": (documents.operator_requeueable("j"), []),
    "cancel": (documents.cancellable("j"), []),
    "purge": (documents.purgeable("done", 60, 0), []),
    "list": (documents.listing(None, "a"), documents.ID_SORT),
    "list by status": (documents.listing("failed", "a"), documents.ID_SORT),
}


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_every_query_builder_is_served_by_a_job_index(name):
    query, sort = QUERIES[name]
    assert indexes.unserved(query, sort, JOBS) == []


#: The queries no job index but the partial KEYED_INDEX serves.
KEYED_ONLY = sorted(name for name, (query, sort) in QUERIES.items() if indexes.unserved(
    query, sort, [keys for keys in JOBS if keys != indexes.KEYED_INDEX]))


def test_the_key_walk_and_the_key_counts_are_the_queries_only_the_keyed_index_serves():
    assert KEYED_ONLY == ["claim of one key", "key counts", "keys running", "pending keys",
                          "processing key counts"]


@pytest.mark.parametrize("name", KEYED_ONLY)
def test_a_query_that_only_the_partial_keyed_index_serves_carries_its_filter(name):
    # MongoDB uses a partial index only for a query that implies its partialFilterExpression:
    # without it the server would read every job for the key walk.
    query, _ = QUERIES[name]
    for branch in indexes.branches(query):
        assert ("concurrency_key", documents.HAS_KEY["concurrency_key"]) in branch, branch


def test_the_journal_query_is_served_by_the_journal_index():
    journal = [keys for keys, _ in indexes.journal_indexes()]
    query = documents.journal_of("q", "j")
    assert indexes.unserved(query, documents.JOURNAL_SORT, journal) == []
    assert indexes.unserved(documents.journals_of("q", ["a", "b"]), [], journal) == []
    assert indexes.unserved(query, documents.JOURNAL_SORT, [OLD_INDEX]) != []


@pytest.mark.parametrize("pipeline", [
    operators.hourly("q", datetime(2026, 1, 1, tzinfo=UTC)),
    operators.counted("q", datetime(2026, 1, 1, tzinfo=UTC))], ids=["per hour", "last hour"])
def test_the_journal_counts_are_served_by_the_journal_time_index(pipeline):
    # The dashboard reads them every second: a range on the time after the queue's equality
    match = pipeline[0]["$match"]
    assert indexes.unserved(match, [], [indexes.JOURNAL_TIME_INDEX]) == []
    assert indexes.unserved(match, [], [indexes.ID_INDEX]) != []
