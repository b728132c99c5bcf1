"""The ESR rule (``indexes.unserved``) as a pure function, and every query builder of the store
checked with it against the store's indexes (issue 11, 7: the claim sorted on
``lease_until, _id`` while the only index was ``{status, lease_until}``)."""

from __future__ import annotations

import pytest

from leaseq.stores.mongodb import documents as D
from leaseq.stores.mongodb import indexes as ix

JOBS = [keys for keys, _ in ix.job_indexes({"tombstone": 60})]
OLD_INDEX = [("status", 1), ("lease_until", 1)]


# --- the rule ------------------------------------------------------------------------------


def test_equality_then_sort_then_range_is_served():
    query = {"status": "done", "updated_at": {"$gt": 1}}
    assert ix.unserved(query, [("_id", 1)], [[("status", 1), ("_id", 1), ("updated_at", 1)]]) == []


def test_a_range_before_the_sort_is_not_served():
    # the index would be read by updated_at, so the _id order needs a blocking sort
    query = {"status": "done", "updated_at": {"$gt": 1}}
    assert ix.unserved(query, [("_id", 1)], [[("status", 1), ("updated_at", 1), ("_id", 1)]])


def test_a_range_on_the_first_sort_key_is_served_by_the_sort():
    query = {"status": "pending", "lease_until": {"$type": "date"}}
    assert ix.unserved(query, D.CLAIM_SORT, [ix.CLAIM_INDEX]) == []


def test_an_index_read_backwards_serves_the_reversed_sort():
    query = {"status": "pending"}
    assert ix.unserved(query, [("_id", -1)], [[("status", 1), ("_id", 1)]]) == []
    mixed = [("lease_until", 1), ("_id", -1)]
    assert ix.unserved(query, mixed, [ix.CLAIM_INDEX])


def test_every_equality_field_must_lead_the_index():
    query = {"status": "pending", "published_at": None}
    assert ix.unserved(query, [], [ix.CLAIM_INDEX])  # published_at would be read and dropped
    assert ix.unserved(query, [], [[("lease_until", 1), ("status", 1)]])
    assert ix.unserved(query, [], [ix.OUTBOX_INDEX]) == []


def test_a_range_field_missing_from_the_index_is_not_served():
    assert ix.unserved({"status": "done", "updated_at": {"$lt": 5}}, [], [ix.LISTING_INDEX])


def test_an_or_is_served_only_when_every_branch_is():
    query = {"$or": [{"status": "pending"}, {"published_at": {"$type": "date"}}]}
    missing = ix.unserved(query, [], [ix.CLAIM_INDEX])
    assert missing == [[("published_at", {"$type": "date"})]]


def test_conditions_around_an_or_and_inside_and_join_every_branch():
    query = {"status": "pending", "$and": [{"$or": [{"a": 1}, {"b": 2}]}],
             "$or": [{"c": 3}, {"d": 4}]}
    found = ix.branches(query)
    assert len(found) == 4
    assert all(("status", "pending") in branch for branch in found)


def test_an_id_equality_is_served_by_the_id_index():
    assert ix.unserved({"_id": "a", "status": "processing", "lease_epoch": 3}, [], []) == []
    assert ix.unserved({"_id": {"$in": ["a", "b"]}, "x": 1}, [], []) == []


def test_expr_comparisons_with_a_constant_are_ranges_and_field_pairs_are_left_to_the_fetch():
    clock = D.now(0)
    equal, ranged = ix.classify([("$expr", {"$and": [
        {"$lte": ["$lease_until", clock]}, {"$lt": ["$attempts", "$max_attempts"]},
        {"$eq": ["$status", {"$literal": "$x"}]}]})])
    assert (equal, ranged) == ({"status"}, {"lease_until"})
    assert ix.classify([("$expr", {"$or": [{"$lt": ["$a", 1]}]})]) == (set(), set())
    assert ix.classify([("$expr", "$flag")]) == (set(), set())


def test_negations_and_existence_bound_nothing():
    branch = [("stale", {"$ne": True}), ("s", {"$nin": [1]}), ("e", {"$exists": False})]
    assert ix.classify(branch) == (set(), set())


def test_an_empty_filter_needs_no_index():
    assert ix.unserved({}, [], []) == []


def test_index_names_are_mongodbs_defaults():
    assert ix.name_of(OLD_INDEX) == "status_1_lease_until_1"
    assert ix.name_of(ix.CLAIM_INDEX) == "status_1_priority_-1_lease_until_1__id_1"


# --- the store's queries -------------------------------------------------------------------


def test_the_old_index_did_not_serve_the_claim():
    # The defect: {status, lease_until} leaves the _id order to a blocking sort of every due job
    assert ix.unserved(D.claimable(0), D.CLAIM_SORT, [OLD_INDEX])


QUERIES = {
    "claim": (D.claimable(0), D.CLAIM_SORT),
    "claim_id": (D.claimable_id("j", 0), []),
    "ready": (D.ready(0)[0]["$match"], []),
    "in_flight": (D.in_flight(0), []),
    "outbox_due": (D.outbox_due(0), D.OUTBOX_SORT),
    "republish": (D.published_before(60, 0), []),
    "mark_published": (D.unpublished([("a", 0), ("b", 2)], 0), []),
    "reclaim step 1": (D.expired(0, spent_=True), []),
    "reclaim step 2": (D.expired(0, spent_=False), []),
    "reclaim step 3": (D.pending_spent(), []),
    "fenced": (D.fenced("j", 1, stale=True), []),
    "heartbeat": (D.held([("a", 1)]), []),
    "retry": (D.operator_retryable("j"), []),
    "cancel": (D.cancellable("j"), []),
    "purge": (D.purgeable("done", 60, 0), []),
    "list": (D.listing(None, "a"), D.ID_SORT),
    "list by status": (D.listing("failed", "a"), D.ID_SORT),
}


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_every_query_builder_is_served_by_a_job_index(name):
    query, sort = QUERIES[name]
    assert ix.unserved(query, sort, JOBS) == []


def test_the_journal_query_is_served_by_the_journal_index():
    journal = [keys for keys, _ in ix.journal_indexes()]
    assert ix.unserved(D.journal_of("q", "j"), D.JOURNAL_SORT, journal) == []
    assert ix.unserved(D.journal_of("q", "j"), D.JOURNAL_SORT, [OLD_INDEX]) != []
