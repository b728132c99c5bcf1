"""The store's filters and pipelines run on sample documents through a model of MongoDB's
semantics (pipeline_model.py): issue 11's rules 1–3 as the MongoDB store writes them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pipeline_model import matches, run

from leaseq.stores.mongodb import documents, upserts

NOW = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
LATER, EARLIER = NOW + timedelta(minutes=5), NOW - timedelta(minutes=5)


def running(**fields: Any) -> dict[str, Any]:
    return {"_id": "j", "status": "processing", "attempts": 1, "max_attempts": 3,
            "lease_epoch": 1, "lease_until": LATER, "worker_id": "w", **fields}


def after(pipeline: list[dict[str, Any]], doc: dict[str, Any]) -> dict[str, Any]:
    return run(pipeline, doc, NOW)


# --- snooze (issue 11, 2) ------------------------------------------------------------------


def test_snoozes_are_counted_and_refunded_until_the_bound_then_exhausted():
    doc = running()
    for n in range(1, 4):
        doc = after(documents.snooze(10, 3, 0), doc)
        assert (doc["status"], doc["snoozes"], doc["attempts"]) == ("pending", n, 0)
        assert doc["lease_until"] == NOW + timedelta(seconds=10)
        doc = after(documents.claim("w", 60, 0, "t0"), doc)
    doc = after(documents.snooze(10, 3, 0), doc)
    assert (doc["status"], doc["failure"], doc["snoozes"]) == ("failed", "exhausted", 4)
    assert doc["error"] == "snoozed 4 times without finishing"
    assert doc["lease_until"] is None


def test_a_snooze_keeps_the_last_error_and_an_adopted_document_counts_from_zero():
    doc = after(documents.snooze(0, 200, 0), running(error="disk full"))
    assert (doc["snoozes"], doc["error"]) == (1, "disk full")
    assert "error" not in after(documents.snooze(0, 200, 0), running())


# --- give-back (issue 11, 1) ---------------------------------------------------------------


def test_a_give_back_of_a_handler_that_never_started_is_free_for_ever():
    doc = running()
    for _ in range(10):
        doc = after(documents.give_back(False, 3, 0), doc)
        assert (doc["status"], doc["attempts"], doc.get("givebacks")) == ("pending", 0, None)
        assert doc["lease_until"] == NOW and doc["published_at"] is None
        doc = after(documents.claim("w", 60, 0, "t0"), doc)
    assert doc["lease_epoch"] == 11  # every claim counted: the 2nd on is `redelivered`


def test_a_running_job_given_back_past_the_bound_spends_its_attempts_then_fails():
    # Given a job whose handler outlives every grace period (max_attempts 3, max_givebacks 2)
    doc, seen = running(), []
    for _ in range(10):
        doc = after(documents.give_back(True, 2, 0), doc)
        seen.append((doc["status"], doc["attempts"], doc["givebacks"]))
        if doc["status"] == "failed":
            break
        doc = after(documents.claim("w", 60, 0, "t0"), doc)
    # Then two give-backs were free, the next ones spent the attempt, and it ended
    assert seen == [("pending", 0, 1), ("pending", 0, 2), ("pending", 1, 2),
                    ("pending", 2, 2), ("failed", 3, 2)]
    assert doc["failure"] == "exhausted"
    assert doc["error"] == "given back 2 times while its handler ran; its attempts are spent"


def test_a_give_back_is_not_a_snooze():
    assert "snoozes" not in after(documents.give_back(True, 3, 0), running())


# --- stale revisions and new revisions (issue 11, 1 and 3) -------------------------------


def test_a_stale_finish_starts_the_job_afresh():
    doc = after(documents.stale_give_back(0),
                running(attempts=3, snoozes=4, givebacks=2, stale=True))
    assert (doc["status"], doc["attempts"], doc["snoozes"], doc["givebacks"]) == (
        "pending", 0, 0, 0)
    assert doc["stale"] is False and doc["lease_until"] == NOW


def test_a_new_revision_of_a_pending_job_resets_attempts_under_the_new_max():
    # Given three transient failures of five, then a new revision whose policy says 2
    stored = {"_id": "j", "status": "pending", "attempts": 3, "max_attempts": 5,
              "snoozes": 1, "givebacks": 1, "lease_until": LATER}
    fields = upserts.upsert_fields(upserts.UPDATE, "t", "r2", 2, 0, 0)
    doc = run([{"$set": fields}], stored, NOW)
    # Then it is claimable again: attempts 0 of 2
    assert (doc["attempts"], doc["max_attempts"], doc["snoozes"], doc["givebacks"]) == (
        0, 2, 0, 0)
    assert matches(documents.claimable(0), doc, NOW)


def test_a_new_revision_of_a_running_job_resets_its_budget_and_keeps_its_lease():
    # Given a job running its third attempt, with snoozes and give-backs spent
    stored = running(attempts=3, snoozes=2, givebacks=1)
    # When a new revision arrives, Then it is stale, its budget afresh as on the SQL stores
    # (the running attempt was the old revision's), its lease and holder as they were
    doc = run([{"$set": upserts.upsert_fields(upserts.STALE, "t", "r2", 5, 0, 0)}], stored, NOW)
    assert (doc["stale"], doc["attempts"], doc["snoozes"], doc["givebacks"]) == (True, 0, 0, 0)
    assert (doc["status"], doc["lease_until"], doc["worker_id"]) == (
        stored["status"], stored["lease_until"], stored["worker_id"])


def test_an_expired_stale_job_is_returned_afresh_not_failed():
    # Given a stale job whose new revision lowered max_attempts below its attempts
    doc = running(attempts=3, max_attempts=2, stale=True, lease_until=EARLIER)
    # Then reclaim step 1 leaves it, step 2 takes it and resets its attempts
    assert not matches(documents.expired(0, spent_=True), doc, NOW)
    assert matches(documents.expired(0, spent_=False), doc, NOW)
    back = after(documents.return_expired(0), doc)
    assert (back["status"], back["attempts"], back["stale"]) == ("pending", 0, False)
    # And a claim that takes it over first starts it afresh too
    assert matches(documents.claimable(0), doc, NOW)
    claimed = after(documents.claim("w", 60, 0, "t0"), doc)
    assert (claimed["attempts"], claimed["stale"], claimed["lease_epoch"]) == (1, False, 2)


def test_an_expired_job_that_is_not_stale_keeps_its_attempts():
    doc = running(attempts=2, lease_until=EARLIER, snoozes=1)
    back = after(documents.return_expired(0), doc)
    assert (back["attempts"], back["snoozes"]) == (2, 1)
    assert not matches(documents.expired(0, spent_=True), doc, NOW)
    spent = running(attempts=3, lease_until=EARLIER)
    assert matches(documents.expired(0, spent_=True), spent, NOW)
    assert not matches(documents.expired(0, spent_=False), spent, NOW)


def test_reclaim_step_three_finds_only_pending_jobs_with_attempts_spent():
    spent = {"_id": "s", "status": "pending", "attempts": 3, "max_attempts": 2}
    assert matches(documents.pending_spent(), spent, NOW)
    assert not matches(documents.pending_spent(), {**spent, "attempts": 1}, NOW)
    assert not matches(documents.pending_spent(), {"_id": "a", "status": "pending"}, NOW)
    failed = after(documents.exhaust_pending(0), spent)
    assert (failed["status"], failed["failure"]) == ("failed", "exhausted")
    assert failed["error"] == "attempts spent while pending (3 of 2)"  # as the SQL stores


# --- what is claimable, ready and in flight -----------------------------------------------


@pytest.mark.parametrize(("doc", "claimable", "in_flight"), [
    ({"status": "pending"}, True, False),  # adopted: no attempts, no lease_until
    ({"status": "pending", "lease_until": EARLIER, "attempts": 4}, True, False),
    ({"status": "pending", "lease_until": LATER}, False, False),  # backing off
    ({"status": "pending", "attempts": 5}, False, False),  # spent (default max 5)
    ({"status": "processing", "lease_until": LATER, "attempts": 1}, False, True),
    ({"status": "processing", "lease_until": EARLIER, "attempts": 1}, True, False),
    ({"status": "processing", "lease_until": EARLIER, "attempts": 5}, False, False),
    ({"status": "done", "lease_until": None}, False, False),
])
def test_claimable_and_in_flight(doc, claimable, in_flight):
    assert matches(documents.claimable(0), {"_id": "x", **doc}, NOW) is claimable
    assert matches(documents.in_flight(0), {"_id": "x", **doc}, NOW) is in_flight


def test_the_outbox_owes_only_due_unpublished_pending_jobs():
    due = {"_id": "a", "status": "pending", "lease_until": EARLIER, "published_at": None}
    assert matches(documents.outbox_due(0), due, NOW)
    assert not matches(documents.outbox_due(0), {**due, "published_at": EARLIER}, NOW)
    assert not matches(documents.outbox_due(0), {**due, "lease_until": LATER}, NOW)



def test_a_late_confirm_marks_only_a_job_not_changed_since_it_was_read():
    # A job read at EARLIER, then cancelled and requeued at the same epoch (updated at NOW)
    read = {"_id": "a", "status": "pending", "lease_until": EARLIER, "published_at": None,
            "lease_epoch": 2, "updated_at": EARLIER}
    mark = documents.unpublished([("a", 2)], 0, as_of=EARLIER)
    assert matches(mark, read, NOW)
    assert not matches(mark, {**read, "updated_at": NOW}, NOW)
    assert matches(documents.unpublished([("a", 2)], 0), {**read, "updated_at": NOW}, NOW)

# --- a new revision's key while the old one runs ------------------------------------------


def test_a_revision_for_a_running_job_keeps_its_key_and_saves_the_new_one():
    fields = upserts.upsert_fields(upserts.STALE, "t", "r2", 3, 0, 0, concurrency_key="new")
    doc = run([{"$set": fields}], running(concurrency_key="old"), NOW)
    assert (doc["stale"], doc["concurrency_key"], doc["next_concurrency_key"]) == (
        True, "old", "new")


@pytest.mark.parametrize("pipeline", [
    documents.stale_give_back(0), documents.return_expired(0), documents.claim("w", 60, 0, "t0"),
    documents.operator_cancel(0)])
def test_the_new_revisions_key_is_taken_when_the_old_attempt_ends(pipeline):
    stale = running(concurrency_key="old", stale=True, next_concurrency_key="new",
                    lease_until=EARLIER)
    assert after(pipeline, stale)["concurrency_key"] == "new"
    assert after(pipeline, {**stale, "next_concurrency_key": None})["concurrency_key"] is None
    # A job that is not stale, or a stale one from before the field, keeps its key
    assert after(pipeline, {**stale, "stale": False})["concurrency_key"] == "old"
    older = {k: v for k, v in stale.items() if k != "next_concurrency_key"}
    assert after(pipeline, older)["concurrency_key"] == "old"
