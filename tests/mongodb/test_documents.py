"""The documents the MongoDB store sends, asserted against the shapes of issue 5 and
DESIGN.md §3. Pure builders, no server (see mongo_fakes.py for why these are store-specific)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from leaseq.job import JobSpec, Lease
from leaseq.stores.mongodb import documents, upserts

NOW = {"$dateAdd": {"startDate": "$$NOW", "unit": "millisecond", "amount": 0}}


def walk(node: Any) -> list[Any]:
    """Every dict, list and scalar inside a document."""
    found = [node]
    if isinstance(node, dict):
        for value in node.values():
            found += walk(value)
    elif isinstance(node, list):
        for value in node:
            found += walk(value)
    return found


def keys_in(node: Any) -> set[str]:
    return {k for item in walk(node) if isinstance(item, dict) for k in item}


def plus(ms: int) -> dict[str, Any]:
    return {"$dateAdd": {"startDate": "$$NOW", "unit": "millisecond", "amount": ms}}


# --- clock ---------------------------------------------------------------------------------


def test_now_is_the_server_clock_shifted_by_the_offset_in_milliseconds():
    # Given an offset of 1.5 s and a lease of 900 s
    # Then both become one $dateAdd from $$NOW, in whole milliseconds
    assert documents.now(0) == NOW
    assert documents.now(1.5, 900) == plus(901_500)
    assert isinstance(documents.now(0.0004)["$dateAdd"]["amount"], int)


def test_no_builder_reads_the_worker_clock():
    # Every timestamp in every pipeline is rooted in $$NOW (no datetime values are sent)
    pipelines = [documents.claim("w", 30, 0, "t0"), documents.extend(30, 0),
                 documents.snooze(1, 200, 0), documents.fail("e", "x", 0),
                 documents.give_back(True, 3, 0), documents.give_back(False, 3, 0),
                 documents.stale_give_back(0), documents.exhaust_pending(0),
                 documents.retry_later("e", 5, 0), documents.complete("done", None, None, 0),
                 documents.expire_spent(0), documents.return_expired(0),
                 documents.operator_requeue(0), documents.operator_cancel(0),
                 documents.mark_published(0),
                 upserts.upsert({"a": 1}, None, None, 5, 0, "raise", 0)]
    for pipeline in pipelines:
        dates = [n for n in walk(pipeline) if isinstance(n, dict) and "$dateAdd" in n]
        assert dates, pipeline
        assert all(n["$dateAdd"]["startDate"] == "$$NOW" for n in dates)
        assert "datetime" not in repr(pipeline)


# --- claim ---------------------------------------------------------------------------------


STALE = {"$eq": [{"$ifNull": ["$stale", False]}, True]}
LEFT = {"$lt": [{"$ifNull": ["$attempts", 0]}, {"$ifNull": ["$max_attempts", 5]}]}


def test_claim_filter_is_a_rooted_or_of_the_three_branches_of_the_issue():
    # A rooted $or, every condition inside each branch: one index scan per branch
    query = documents.claimable(0)
    assert list(query) == ["$or"]
    fresh, due, expired = query["$or"]
    assert fresh == {"status": "pending", "lease_until": None, "$expr": LEFT}
    assert due["status"] == "pending"
    assert due["$expr"] == {"$and": [{"$lte": ["$lease_until", NOW]}, LEFT]}
    assert expired["status"] == "processing"
    # a stale job's new revision never ran: its spent attempts do not keep it from a claim
    assert expired["$expr"] == {"$and": [{"$lt": ["$lease_until", NOW]}, {"$or": [LEFT, STALE]}]}
    # an aggregation null sorts below every date: only real dates may take the < branches
    assert due["lease_until"] == expired["lease_until"] == {"$type": "date"}


def test_claim_is_a_pipeline_update_with_server_lease_and_counters():
    pipeline = documents.claim("host:1:abcd1234", 900, 2, "t0")
    assert isinstance(pipeline, list) and len(pipeline) == 1 and list(pipeline[0]) == ["$set"]
    fields = pipeline[0]["$set"]
    assert fields["status"] == "processing"
    assert fields["worker_id"] == {"$literal": "host:1:abcd1234"}
    assert fields["lease_until"] == plus(902_000)
    assert fields["attempts"] == {
        "$cond": [STALE, 1, {"$add": [{"$ifNull": ["$attempts", 0]}, 1]}]}
    assert fields["snoozes"] == {"$cond": [STALE, 0, "$snoozes"]}
    assert fields["givebacks"] == {"$cond": [STALE, 0, "$givebacks"]}
    assert fields["lease_epoch"] == {"$add": [{"$ifNull": ["$lease_epoch", 0]}, 1]}
    assert fields["updated_at"] == plus(2000)
    assert fields["stale"] is False
    assert fields["first_seen_at"] == {"$ifNull": ["$first_seen_at", plus(2000)]}
    assert fields["max_attempts"] == {"$ifNull": ["$max_attempts", 5]}


def test_claim_sort_is_priority_then_not_before_then_id():
    assert documents.CLAIM_SORT == [("priority", -1), ("lease_until", 1), ("_id", 1)]


def test_claim_one_is_the_claim_filter_for_one_id():
    assert documents.claimable_id("job-1", 0) == {"_id": "job-1", **documents.claimable(0)}


def test_no_set_on_insert_anywhere():
    every = [documents.claim("w", 1, 0, "t0"),
             upserts.upsert({"a": 1}, "t", "r", 5, 3, "replace", 0)]
    assert not any("$setOnInsert" in keys_in(p) for p in every)


# --- fencing -------------------------------------------------------------------------------


def test_fence_is_id_epoch_worker_and_processing():
    assert documents.fenced(Lease("j", 7, "w1")) == {
        "_id": "j", "lease_epoch": 7, "worker_id": "w1", "status": "processing"}
    # a lease made by hand, with no worker, leaves the worker unchecked
    assert documents.fenced(Lease("j", 7)) == {"_id": "j", "lease_epoch": 7,
                                               "status": "processing"}
    assert documents.fenced(Lease("j", 7), stale=False)["stale"] == {"$ne": True}
    assert documents.fenced(Lease("j", 7), stale=True)["stale"] is True


def test_fence_checks_the_claims_token_when_the_lease_has_one():
    # A job deleted and enqueued again, claimed by the same worker: only the token differs
    assert documents.fenced(Lease("j", 1, "w1", "t1")) == {
        "_id": "j", "lease_epoch": 1, "worker_id": "w1", "claim_token": "t1",
        "status": "processing"}
    assert documents.held([Lease("j", 1, "w1", "t1")])["$or"] == [
        {"_id": "j", "lease_epoch": 1, "worker_id": "w1", "claim_token": "t1"}]


def test_each_claim_call_gets_a_token_of_its_own_and_stamps_it():
    one, two = documents.new_claim_token(), documents.new_claim_token()
    assert one != two and len(one) == 32
    assert documents.claim("w", 60, 0, one)[0]["$set"]["claim_token"] == {"$literal": one}


def test_heartbeat_filter_fences_each_lease_by_its_own_epoch_and_worker():
    query = documents.held([Lease("a", 1, "w1"), Lease("b", 4)])
    assert query == {"_id": {"$in": ["a", "b"]}, "status": "processing",
                     "$or": [{"_id": "a", "lease_epoch": 1, "worker_id": "w1"},
                             {"_id": "b", "lease_epoch": 4}]}
    assert documents.extend(60, 0) == [{"$set": {"lease_until": plus(60_000)}}]


def test_finishes_clear_the_lease_and_keep_caller_values_literal():
    done = documents.complete("done", '{"$x":1}', "$key", 0)[0]["$set"]
    assert done["result"] == {"$literal": '{"$x":1}'} and done["result_key"] == {"$literal": "$key"}
    assert done["lease_until"] is None and done["status"] == {"$literal": "done"}
    failed = documents.fail("$boom", "permanent", 0)[0]["$set"]
    assert failed == {"status": "failed", "failure": {"$literal": "permanent"},
                      "error": {"$literal": "$boom"}, "lease_until": None, "updated_at": NOW}


def test_retry_later_turns_into_exhausted_when_attempts_are_spent():
    fields = documents.retry_later("err", 30, 0)[0]["$set"]
    spent = {"$gte": [{"$ifNull": ["$attempts", 0]}, {"$ifNull": ["$max_attempts", 5]}]}
    assert fields["status"] == {"$cond": [spent, "failed", "pending"]}
    assert fields["failure"] == {"$cond": [spent, "exhausted", None]}
    assert fields["lease_until"] == {"$cond": [spent, None, plus(30_000)]}
    # a transition to pending owes the outbox a publish
    assert fields["published_at"] == {"$cond": [spent, "$published_at", None]}


REFUNDED = {"$max": [{"$subtract": [{"$ifNull": ["$attempts", 0]}, 1]}, 0]}
SPENT = {"$gte": [{"$ifNull": ["$attempts", 0]}, {"$ifNull": ["$max_attempts", 5]}]}


def test_snooze_gives_the_attempt_back_and_counts_itself_up_to_the_bound():
    fields = documents.snooze(5, 200, 0)[0]["$set"]
    counted = {"$add": [{"$ifNull": ["$snoozes", 0]}, 1]}
    over = {"$gt": [counted, 200]}
    assert fields["snoozes"] == counted
    assert fields["attempts"] == {"$cond": [over, {"$ifNull": ["$attempts", 0]}, REFUNDED]}
    assert fields["status"] == {"$cond": [over, "failed", "pending"]}
    assert fields["failure"] == {"$cond": [over, "exhausted", None]}
    assert fields["error"]["$cond"][1] == {"$concat": ["snoozed ", {"$toString": counted},
                                                       " times without finishing"]}
    assert fields["published_at"] == {"$cond": [over, "$published_at", None]}
    assert fields["stale"] is False
    assert fields["lease_until"] == {"$cond": [over, None, plus(5000)]}


def test_a_give_back_of_a_job_that_never_started_is_free_and_uncounted():
    fields = documents.give_back(False, 3, 0)[0]["$set"]
    assert fields["attempts"] == REFUNDED and "givebacks" not in fields
    assert fields["status"] == "pending" and fields["lease_until"] == NOW


def test_a_give_back_of_a_running_job_is_free_up_to_the_bound_then_spends_the_attempt():
    fields = documents.give_back(True, 3, 0)[0]["$set"]
    given = {"$ifNull": ["$givebacks", 0]}
    free = {"$lt": [given, 3]}
    out = {"$and": [{"$not": [free]}, SPENT]}
    assert fields["attempts"] == {"$cond": [free, REFUNDED, {"$ifNull": ["$attempts", 0]}]}
    assert fields["givebacks"] == {"$cond": [free, {"$add": [given, 1]}, given]}
    assert fields["status"] == {"$cond": [out, "failed", "pending"]}
    assert fields["failure"] == {"$cond": [out, "exhausted", None]}
    assert fields["lease_until"] == {"$cond": [out, None, NOW]}
    assert "snoozes" not in fields  # a give-back is not a snooze


def test_a_stale_give_back_starts_the_job_afresh():
    fields = documents.stale_give_back(0)[0]["$set"]
    assert (fields["attempts"], fields["snoozes"], fields["givebacks"]) == (0, 0, 0)
    assert fields["status"] == "pending" and fields["lease_until"] == NOW


@pytest.mark.parametrize("pipeline", [
    documents.return_expired(0), documents.operator_requeue(0), documents.give_back(False, 3, 0),
    documents.stale_give_back(0)])
def test_every_transition_to_pending_clears_published_at(pipeline):
    assert pipeline[0]["$set"]["status"] == "pending"
    assert pipeline[0]["$set"]["published_at"] is None


@pytest.mark.parametrize("pipeline", [documents.snooze(0, 200, 0), documents.give_back(True, 3, 0),
                                      documents.retry_later("e", 0, 0)])
def test_a_conditional_transition_to_pending_clears_published_at(pipeline):
    fields = pipeline[0]["$set"]
    condition = fields["status"]["$cond"][0]
    assert fields["status"] == {"$cond": [condition, "failed", "pending"]}
    assert fields["published_at"] == {"$cond": [condition, "$published_at", None]}


# --- reclaim -------------------------------------------------------------------------------


def test_reclaim_step_one_takes_only_spent_expired_jobs_that_are_not_stale():
    assert documents.expired(0, spent_=True) == {
        "status": "processing", "lease_until": {"$type": "date"},
        "$expr": {"$and": [{"$lt": ["$lease_until", NOW]},
                           {"$and": [SPENT, {"$not": [STALE]}]}]}}
    unspent = documents.expired(0, spent_=False)["$expr"]["$and"][1]
    assert unspent == {"$or": [STALE, {"$not": [SPENT]}]}
    fields = documents.expire_spent(0)[0]["$set"]
    assert fields["status"] == "failed" and fields["failure"] == "expired"
    assert fields["lease_until"] is None


def test_reclaim_step_two_resets_the_attempts_of_a_stale_job_only():
    back = documents.return_expired(0)[0]["$set"]
    assert back["status"] == "pending" and back["lease_until"] == NOW
    assert back["attempts"] == {"$cond": [STALE, 0, {"$ifNull": ["$attempts", 0]}]}
    assert back["givebacks"] == {"$cond": [STALE, 0, {"$ifNull": ["$givebacks", 0]}]}


def test_reclaim_step_three_quarantines_pending_jobs_with_attempts_spent():
    assert documents.pending_spent() == {"status": "pending", "attempts": {"$gte": 1},
                                         "$expr": SPENT}
    fields = documents.exhaust_pending(0)[0]["$set"]
    assert (fields["status"], fields["failure"], fields["lease_until"]) == (
        "failed", "exhausted", None)


def test_in_flight_is_processing_with_a_live_lease():
    assert documents.in_flight(0) == {"status": "processing", "lease_until": {"$type": "date"},
                              "$expr": {"$gt": ["$lease_until", NOW]}}


def test_lapsed_is_processing_with_a_lease_that_ran_out():
    assert documents.lapsed(0) == {"status": "processing", "lease_until": {"$type": "date"},
                                   "$expr": {"$lt": ["$lease_until", NOW]}}


# --- indexes -------------------------------------------------------------------------------


def test_indexes_claim_index_and_ttl_only_with_a_partial_filter():
    specs = documents.job_indexes({"tombstone": 2_592_000, "done": 86_400})
    assert specs[0] == ([("status", 1), ("priority", -1), ("lease_until", 1), ("_id", 1)],
                        {"name": "status_1_priority_-1_lease_until_1__id_1"})
    ttl = [(keys, opts) for keys, opts in specs if "expireAfterSeconds" in opts]
    assert len(ttl) == 2
    for keys, opts in ttl:
        assert keys == [("updated_at", 1)]
        assert opts["partialFilterExpression"] == {"status": opts["name"].split("_", 2)[2]}
    assert documents.job_indexes({}) == specs[:-2]  # no TTL asked: no TTL index at all


# --- upsert --------------------------------------------------------------------------------


def branches(pipeline: list[dict[str, Any]]) -> dict[str, Any]:
    switch = pipeline[0]["$replaceWith"]["$let"]["in"]["$switch"]
    assert switch["default"] == "$$ROOT"  # keep / conflict: the document as it was
    return {b["case"]["$eq"][1]: b["then"]["$mergeObjects"] for b in switch["branches"]}


def test_upsert_keeps_the_record_puts_the_payload_beside_it_then_the_branch_fields():
    pipeline = upserts.upsert({"file": "$a.mp4"}, "sync", "md5-1", 7, 10, "raise", 0)
    assert len(pipeline) == 1 and list(pipeline[0]) == ["$replaceWith"]
    found = branches(pipeline)
    assert set(found) == {"create", "revive", "update", "stale"}
    record, payload, fields = found["create"]
    assert record["$arrayToObject"]["$filter"]["cond"] == {
        "$in": ["$$this.k", documents.RECORD_FIELDS]}
    assert payload == {"$literal": {"file": "$a.mp4"}}
    assert fields["first_seen_at"] == {"$ifNull": ["$first_seen_at", NOW]}
    assert fields["lease_until"] == plus(10_000) and fields["attempts"] == 0
    assert fields["lease_epoch"] == 0 and fields["revision"] == {"$literal": "md5-1"}


def test_upsert_branch_fields_follow_the_protocol():
    found = branches(upserts.upsert({"a": 1}, None, "r2", 5, 0, "raise", 0))
    revive = found["revive"][2]
    assert revive["status"] == "pending" and revive["attempts"] == 0
    assert revive["failure"] is None and revive["result"] is None
    assert "lease_epoch" not in revive  # the epoch only ever grows
    stale = found["stale"][2]
    assert stale["stale"] is True and "lease_until" not in stale and "status" not in stale
    update = found["update"][2]
    assert update["published_at"] is None
    # a new revision of a pending job starts afresh under the spec's max_attempts (issue 11, 3)
    assert (update["attempts"], update["snoozes"], update["givebacks"]) == (0, 0, 0)
    assert update["max_attempts"] == 5


def test_upsert_decision_is_computed_from_the_stored_document():
    pipeline = upserts.upsert({"a": 1}, None, "r2", 5, 0, "raise", 0)
    op = pipeline[0]["$replaceWith"]["$let"]["vars"]["op"]
    first, changed = op["$switch"]["branches"]
    assert first == {"case": {"$eq": [{"$type": "$status"}, "missing"]}, "then": "create"}
    assert changed["case"] == {"$ne": ["$revision", {"$literal": "r2"}]}
    assert op["$switch"]["default"] == "keep"
    # without a revision only "replace" may change the stored job
    raise_op = upserts.upsert_op({"a": 1}, None, "raise")
    assert raise_op["$switch"]["branches"][1]["case"] is False
    replace_op = upserts.upsert_op({"a": 1}, None, "replace")
    assert "$not" in replace_op["$switch"]["branches"][1]["case"]


def test_same_payload_compares_top_level_keys_in_any_order():
    expr = upserts.same_payload({"b": 2, "a": [1]})
    size, *fields = expr["$and"]
    assert size["$eq"][1] == 2
    assert {f["$eq"][0]["$getField"]["field"]["$literal"] for f in fields} == {"a", "b"}


@pytest.mark.parametrize(("before", "revision", "on_conflict", "expected"), [
    (None, None, "raise", "create"),
    ({"_id": "j", "status": "pending", "revision": "r1"}, "r1", "raise", "keep"),
    ({"_id": "j", "status": "pending", "revision": "r1"}, "r2", "raise", "update"),
    ({"_id": "j", "status": "processing", "revision": "r1"}, "r2", "raise", "stale"),
    ({"_id": "j", "status": "tombstone", "revision": "r1"}, "r2", "raise", "revive"),
    ({"_id": "j", "status": "done", "a": 1}, None, "raise", "keep"),
    ({"_id": "j", "status": "done", "a": 2}, None, "raise", "conflict"),
    ({"_id": "j", "status": "done", "a": 2}, None, "keep", "conflict"),
    ({"_id": "j", "status": "done", "a": 2}, None, "replace", "revive"),
    ({"_id": "j", "status": "done", "a": 1, "extra": 0}, None, "raise", "conflict"),
])
def test_upsert_outcome_mirrors_the_server_decision(before, revision, on_conflict, expected):
    assert upserts.upsert_outcome(before, {"a": 1}, revision, on_conflict) == expected


def test_payload_equality_is_bson_like():
    assert upserts.bson_equal_payload({"a": 1, "b": 2}, {"b": 2, "a": 1.0})
    assert not upserts.bson_equal_payload({"a": True}, {"a": 1})
    assert not upserts.bson_equal_payload({"a": {"x": 1, "y": 2}}, {"a": {"y": 2, "x": 1}})


def spec(job_id: str, payload: dict[str, Any], revision: str | None = None) -> JobSpec:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return JobSpec(job_id, payload, text, revision=revision)


def test_batch_conflicts_sees_earlier_specs_of_the_same_batch():
    stored = {"old": {"_id": "old", "status": "pending", "a": 1}}
    specs = [spec("old", {"a": 1}), spec("new", {"a": 1}), spec("new", {"a": 2}),
             spec("old", {"a": 3}, revision="r"), spec("old", {"a": 3})]
    assert upserts.batch_conflicts(stored, specs) == ["new"]


def test_payload_of_is_every_field_that_is_not_the_record():
    doc = {"_id": "x", "status": "done", "attempts": 1, "name": "a.mp4", "md5": "ff"}
    assert documents.payload_of(doc) == {"name": "a.mp4", "md5": "ff"}


def test_journal_entry_is_stamped_by_the_server():
    pipeline = documents.journal_entry("q", "j", "claimed", {"attempt": 1, "reason": "$r"}, 0)
    fields = pipeline[0]["$set"]
    assert fields["at"] == NOW and fields["reason"] == {"$literal": "$r"}


def test_mark_published_only_touches_due_unpublished_pending_jobs_at_their_epoch() -> None:
    doc = documents.unpublished([("a", 0), ("b", 3)], 0.0)
    assert doc["_id"] == {"$in": ["a", "b"]}
    assert (doc["status"], doc["published_at"]) == ("pending", None)
    at_epoch, due = doc["$and"]
    assert at_epoch == {"$or": [{"_id": "a", "lease_epoch": 0},
                                {"_id": "a", "lease_epoch": {"$exists": False}},
                                {"_id": "b", "lease_epoch": 3}]}
    assert due == {"$or": documents.outbox_due(0.0)["$or"]}


def test_purge_reads_only_dated_documents_of_the_status():
    assert documents.purgeable("done", 60, 0) == {
        "status": "done", "updated_at": {"$type": "date"},
        "$expr": {"$lt": ["$updated_at", plus(-60_000)]}}


def test_republish_clears_the_mark_of_pending_jobs_published_long_ago() -> None:
    doc = documents.published_before(300.0, 0.0)
    assert (doc["status"], doc["published_at"]) == ("pending", {"$type": "date"})
    assert doc["$expr"] == {"$lt": ["$published_at", documents.now(0.0, -300.0)]}
    assert documents.unpublish() == [{"$set": {"published_at": None}}]
