"""The MongoDB store's limited claim (limited.py) against the recording fake: the limits
document is written first in the claim's transaction, keys and rate decide what is claimed,
and the key counts' "ready" expression says what the claimable filter says."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from mongo_fakes import INDEX_SET_UP, REPLICA_SET, FakeDB
from pipeline_model import evaluate, matches, truthy

from leaseq.errors import InvalidQueueName, UnsupportedOperation
from leaseq.limits import UNKEYED_SCAN, ClaimLimits, HeldBack
from leaseq.stores.mongodb import MongoStore, documents
from leaseq.stores.mongodb.limited import _claim_order, _seconds

Q, LIMITS = "leaseq_q", "leaseq_limits"
T0 = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
KEYS = ClaimLimits(key_limit=2)


def job(job_id: str, **fields: Any) -> dict[str, Any]:
    return {"_id": job_id, "status": "processing", "attempts": 1, "max_attempts": 5,
            "lease_epoch": 1, "worker_id": "w", "lease_until": T0, **fields}


def gate(*recent: float) -> dict[str, Any]:
    return {"_id": "q", "claims": 1, "recent": list(recent), "now": T0}


@pytest.fixture
def db() -> FakeDB:
    return FakeDB(dict(REPLICA_SET))


@pytest.fixture
def store(db: FakeDB) -> MongoStore:
    return MongoStore(db)


def claimed_ids(db: FakeDB) -> list[str]:
    return [k["filter"]["_id"] if "filter" in k else a[0]["_id"]
            for a, k in db.of(Q, "find_one_and_update")]


def test_a_key_limited_claim_takes_the_queues_front_when_the_limits_let_it_run(db, store):
    # Given a queue's front (fewer jobs than a window: all it has ready) in claim order: jobs
    # of key a (one running), of key b (full), without a key, and with a key that is no string
    db[LIMITS].answer("find_one_and_update", gate())
    db[Q].answer("find", [{"_id": "k1", "priority": 9, "lease_until": T0, "concurrency_key": "a"},
                          {"_id": "b1", "priority": 9, "lease_until": T0, "concurrency_key": "b"},
                          {"_id": "k2", "priority": 5, "lease_until": T0, "concurrency_key": "a"},
                          {"_id": "x1", "priority": 1, "lease_until": T0, "concurrency_key": 7},
                          {"_id": "u1", "priority": 0, "lease_until": T0}])
    db[Q].answer("aggregate", [{"_id": "a", "running": 1}, {"_id": "b", "running": 2}])
    db[Q].answer("find_one_and_update", job("k1"), job("u1"))
    # When it claims up to 3
    jobs = store.claim("q", "w", 3, 60, KEYS)
    # Then key a's one free slot and the job without a key are taken, in claim order
    assert [j.id for j in jobs] == ["k1", "u1"]
    assert claimed_ids(db) == ["k1", "u1"]
    # From one read of the front and one count of its keys' running jobs, no key walk
    (front,) = db.of(Q, "find")
    assert front[0][0] == documents.claimable(0) and front[1]["limit"] == 2 * 3 + UNKEYED_SCAN
    (count,) = db.of(Q, "aggregate")
    assert count[0][0] == documents.keys_running(["a", "b"])
    # The limits document was written first, inside the one transaction
    sent = [(c, m) for c, m, _, _ in db.calls if m not in INDEX_SET_UP]
    assert sent[0] == (LIMITS, "find_one_and_update")
    assert db.client.transactions == ["start", "commit", "end_session"]


def test_a_key_limited_claim_walks_the_keys_when_full_keys_fill_the_front(db, store):
    # Given a front (a whole window) of one full key, and behind it jobs without a key and of
    # two more keys: a (one running) and c (full, none pending)
    db[LIMITS].answer("find_one_and_update", gate())
    full_front = [{"_id": f"b{i}", "priority": 9, "lease_until": T0, "concurrency_key": "b"}
                  for i in range(2 * 3 + UNKEYED_SCAN)]
    db[Q].answer("find", full_front,
                 [{"_id": "u1", "priority": 0, "lease_until": T0},
                  {"_id": "k1", "priority": 9, "lease_until": T0, "concurrency_key": "a"}],
                 [{"_id": "a1", "priority": 5, "lease_until": T0, "concurrency_key": "a"}])
    db[Q].answer("aggregate", [{"_id": "b", "running": 2}],  # the front's keys
                 [{"_id": "b"}, {"_id": "a"}],  # keys with pending jobs
                 [{"_id": "a", "running": 1, "ready": 0}, {"_id": "c", "running": 2, "ready": 1},
                  {"_id": "b", "running": 2, "ready": 0}])  # keys with processing jobs
    db[Q].answer("find_one_and_update", job("a1"), job("u1"))
    # When it claims up to 3
    jobs = store.claim("q", "w", 3, 60, KEYS)
    # Then it walks the keys: key a's one free slot and the unkeyed job, best priority first
    assert [j.id for j in jobs] == ["a1", "u1"]
    assert claimed_ids(db) == ["a1", "u1"]
    # The keys came from the pending jobs' keys and the processing jobs' counts
    walk = [a[0] for a, _ in db.of(Q, "aggregate")[1:]]
    assert walk == [documents.pending_keys(), documents.key_counts(0, processing_only=True)]
    # Only the key with a free slot was walked (c has a lapsed lease, but no slot): after the
    # front, one find for jobs without a key, one for key "a"
    finds = db.of(Q, "find")
    assert len(finds) == 3 and finds[2][0][0] == documents.claimable_keyed("a", 0)
    assert finds[2][1]["limit"] == 1
    # And the next claims of the queue walk the keys at once, without reading the front
    assert not store._front_first.worth_reading(Q)


def test_a_key_walk_takes_a_lapsed_job_of_a_key_with_nothing_pending(db, store):
    # Given a front full of one full key, and a key "d" with no pending job but one processing
    # job whose lease ran out (claimable again), below its limit
    db[LIMITS].answer("find_one_and_update", gate())
    full_front = [{"_id": f"b{i}", "priority": 9, "lease_until": T0, "concurrency_key": "b"}
                  for i in range(2 * 1 + UNKEYED_SCAN)]
    db[Q].answer("find", full_front, [],
                 [{"_id": "d1", "priority": 0, "lease_until": T0, "concurrency_key": "d"}])
    db[Q].answer("aggregate", [{"_id": "b", "running": 2}], [{"_id": "b"}],
                 [{"_id": "b", "running": 2, "ready": 0}, {"_id": "d", "running": 1, "ready": 1}])
    db[Q].answer("find_one_and_update", job("d1", lease_epoch=2))
    # When it claims one
    jobs = store.claim("q", "w", 1, 60, KEYS)
    # Then the walk found key d through its processing count and took its lapsed job
    assert [j.id for j in jobs] == ["d1"]
    assert db.of(Q, "find")[2][0][0] == documents.claimable_keyed("d", 0)


def test_a_rate_limited_claim_takes_the_room_left_and_logs_its_stamps(db, store):
    # Given 2 of 3 claims in the last second
    now = T0.timestamp()
    db[LIMITS].answer("find_one_and_update", gate(now - 2.0, now - 0.5, now - 0.1))
    db[Q].answer("find", [{"_id": "j1"}])
    db[Q].answer("find_one_and_update", job("j1"))
    # When it asks for 5
    jobs = store.claim("q", "w", 5, 60, ClaimLimits(rate_per_s=3))
    # Then it read one candidate and wrote the log: the two recent stamps and its own
    assert [j.id for j in jobs] == ["j1"]
    assert db.of(Q, "find")[0][1]["limit"] == 1
    saved = db.of(LIMITS, "find_one_and_update")[1]
    assert saved[0][1] == {"$set": {"recent": [now - 0.5, now - 0.1, now]}}


def test_a_full_window_claims_nothing(db, store):
    now = T0.timestamp()
    db[LIMITS].answer("find_one_and_update", gate(now - 0.3, now - 0.2))
    assert store.claim("q", "w", 5, 60, ClaimLimits(rate_per_s=2)) == []
    assert db.of(Q, "find") == [] and len(db.of(LIMITS, "find_one_and_update")) == 1


def test_claim_one_under_a_key_limit_needs_a_free_slot(db, store):
    # Given job j1 of key "a" with one running, and key_limit 1
    db[LIMITS].answer("find_one_and_update", gate(), gate(), gate())
    db[Q].answer("find_one", {"_id": "j1", "concurrency_key": "a"}, {"_id": "j2"},
                 {"_id": "j1", "concurrency_key": "a"})
    db[Q].answer("count_documents", 1, 0)
    db[Q].answer("find_one_and_update", job("j2"), job("j1"))
    one = ClaimLimits(key_limit=1)
    # Then j1 waits, j2 (no key) goes, and j1 goes once its key has room
    assert store.claim_one("q", "j1", "w", 60, one) is None
    assert store.claim_one("q", "j2", "w", 60, one).id == "j2"  # type: ignore[union-attr]
    assert store.claim_one("q", "j1", "w", 60, one).id == "j1"  # type: ignore[union-attr]


def test_claim_one_under_a_rate_limit_only(db, store):
    db[LIMITS].answer("find_one_and_update", gate())
    db[Q].answer("find_one_and_update", job("j1"))
    assert store.claim_one("q", "j1", "w", 60, ClaimLimits(rate_per_s=5)).id == "j1"  # type: ignore[union-attr]
    assert db.of(Q, "find_one") == []


def test_limits_need_transactions():
    store = MongoStore(FakeDB())
    assert not store.supports_claim_limits
    with pytest.raises(UnsupportedOperation, match="transactions"):
        store.claim("q", "w", 1, 60, KEYS)


def test_limits_is_a_taken_queue_name(store):
    with pytest.raises(InvalidQueueName, match="claim limits"):
        store.get("limits", "j1")


def test_held_back_without_a_key_limit_reads_no_keys(db, store):
    db[Q].answer("aggregate", [{"n": 4, "age_ms": 1}])
    db[LIMITS].answer("find_one", {"recent": [T0.timestamp() - 0.5]})
    # 4 ready, 2 a second: 2 beyond one second's claims, whatever the window holds now
    assert store.held_back("q", ClaimLimits(rate_per_s=2)) == HeldBack(0, 2)
    assert len(db.of(Q, "aggregate")) == 1


def test_claim_order_puts_a_missing_priority_last_and_no_lease_first():
    docs = [{"_id": "b", "priority": 1, "lease_until": T0},
            {"_id": "n", "lease_until": T0},
            {"_id": "a", "priority": 1},
            {"_id": "h", "priority": 7, "lease_until": T0 + timedelta(seconds=1)}]
    assert [d["_id"] for d in sorted(docs, key=_claim_order)] == ["h", "a", "b", "n"]


def test_a_limits_document_without_a_clock_is_refused():
    with pytest.raises(ValueError, match="server time"):
        _seconds(None)


@pytest.mark.parametrize("sample", [
    {"status": "pending", "lease_until": None},
    {"status": "pending"},
    {"status": "pending", "lease_until": T0 - timedelta(seconds=1)},
    {"status": "pending", "lease_until": T0 + timedelta(seconds=1)},
    {"status": "pending", "lease_until": T0, "attempts": 5, "max_attempts": 5},
    {"status": "processing", "lease_until": T0 - timedelta(seconds=1), "attempts": 1},
    {"status": "processing", "lease_until": T0 + timedelta(seconds=1), "attempts": 1},
    {"status": "processing", "lease_until": T0 - timedelta(seconds=1), "attempts": 5,
     "max_attempts": 5, "stale": True},
    {"status": "processing", "lease_until": T0 - timedelta(seconds=1), "attempts": 5,
     "max_attempts": 5},
    {"status": "done", "lease_until": None},
])
def test_key_counts_ready_is_the_claimable_filter(sample):
    group = documents.key_counts(0)[1]["$group"]
    ready = group["ready"]["$sum"]["$cond"][0]
    running = group["running"]["$sum"]["$cond"][0]
    doc = {"_id": "j", "concurrency_key": "a", **sample}
    assert truthy(evaluate(ready, doc, T0)) == matches(documents.claimable(0), doc, T0)
    assert truthy(evaluate(running, doc, T0)) == (sample["status"] == "processing")


@pytest.mark.parametrize("sample, listed", [
    ({"status": "pending", "concurrency_key": "a"}, True),
    ({"status": "processing", "concurrency_key": "a"}, False),
    ({"status": "pending", "concurrency_key": 7}, False),
    ({"status": "pending", "concurrency_key": None}, False),
    ({"status": "pending"}, False),
    ({"status": "done", "concurrency_key": "a"}, False),
])
def test_pending_keys_lists_the_string_keys_of_pending_jobs(sample, listed):
    match, group = documents.pending_keys()
    assert matches(match["$match"], {"_id": "j", **sample}, T0) is listed
    # Each key once, and nothing else: the group holds the key alone (a distinct scan's shape)
    assert group == {"$group": {"_id": "$concurrency_key"}}


@pytest.mark.parametrize("sample, counted", [
    ({"status": "processing", "concurrency_key": "a"}, True),
    ({"status": "pending", "concurrency_key": "a"}, False),
    ({"status": "processing", "concurrency_key": 7}, False),
    ({"status": "processing"}, False),
])
def test_the_key_walks_counts_read_only_processing_keyed_jobs(sample, counted):
    match = documents.key_counts(0, processing_only=True)[0]["$match"]
    assert matches(match, {"_id": "j", **sample}, T0) is counted
    # And they count as key_counts does
    assert documents.key_counts(0, processing_only=True)[1] == documents.key_counts(0)[1]


@pytest.mark.parametrize("sample, counted", [
    ({"status": "processing", "concurrency_key": "a"}, True),
    ({"status": "processing", "concurrency_key": "b"}, True),
    ({"status": "pending", "concurrency_key": "a"}, False),
    ({"status": "done", "concurrency_key": "a"}, False),
    ({"status": "processing", "concurrency_key": "c"}, False),
    ({"status": "processing"}, False),
])
def test_keys_running_counts_the_processing_jobs_of_the_keys_asked(sample, counted):
    match = documents.keys_running(["a", "b"])[0]["$match"]
    assert matches(match, {"_id": "j", **sample}, T0) is counted


def test_held_back_without_limits_reads_those_the_claims_recorded(db, store):
    # Given a queue whose limited claims ran with key_limit 1
    db[LIMITS].answer("find_one", {"recent": [], "key_limit": 1, "rate_per_s": None}, None)
    db[Q].answer("aggregate", [{"n": 3, "age_ms": 1}], [{"_id": "a", "ready": 3, "running": 1}])
    # Then held_back with no limits of its own counts by those
    assert store.held_back("q") == HeldBack(by_key=3, by_rate=0)
    # And a queue that never had limits holds nothing back, with no count read
    assert store.held_back("q") == HeldBack()
    assert len(db.of(Q, "aggregate")) == 2


def test_the_limits_document_records_the_limits_of_the_claim(db, store):
    db[LIMITS].answer("find_one_and_update", gate())
    store.claim("q", "w", 1, 60, ClaimLimits(key_limit=3, rate_per_s=7))
    update = db.of(LIMITS, "find_one_and_update")[0][0][1][0]["$set"]
    assert (update["key_limit"], update["rate_per_s"]) == ({"$literal": 3}, {"$literal": 7})


# --- a new revision's key (next_concurrency_key) ------------------------------------------


def moving(job_id: str, old: str | None, new: str | None) -> dict[str, Any]:
    """A candidate whose lease ran out after a new revision named key ``new``."""
    return {"_id": job_id, "priority": 9, "lease_until": T0, "concurrency_key": old,
            "stale": True, "next_concurrency_key": new}


def test_the_front_counts_a_lapsed_job_under_its_new_revisions_key(db, store):
    # Given at the front a lapsed job moving from key a (room) to key b (full), and one of a
    db[LIMITS].answer("find_one_and_update", gate())
    db[Q].answer("find", [moving("m1", "a", "b"),
                          {"_id": "a1", "priority": 0, "lease_until": T0, "concurrency_key": "a"}])
    db[Q].answer("aggregate", [{"_id": "a", "running": 1}, {"_id": "b", "running": 2}])
    db[Q].answer("find_one_and_update", job("a1"))
    # When it claims up to 3
    jobs = store.claim("q", "w", 3, 60, KEYS)
    # Then the moving job waits for b's slot; a's job goes
    assert [j.id for j in jobs] == ["a1"] and claimed_ids(db) == ["a1"]
    (count,) = db.of(Q, "aggregate")
    assert count[0][0] == documents.keys_running(["a", "b"])
    (front,) = db.of(Q, "find")
    assert {"stale", "next_concurrency_key"} <= set(front[0][1])


def test_the_key_walk_leaves_a_lapsed_job_moving_to_another_key(db, store):
    # Given a full front of key b, and under key a (room) a lapsed job moving to key b and one
    # moving to no key (it is one of the jobs without a key then)
    db[LIMITS].answer("find_one_and_update", gate())
    full_front = [{"_id": f"b{i}", "priority": 9, "lease_until": T0, "concurrency_key": "b"}
                  for i in range(2 * 3 + UNKEYED_SCAN)]
    db[Q].answer("find", full_front, [moving("u1", "a", None)],
                 [moving("m1", "a", "b"),
                  {"_id": "a1", "priority": 0, "lease_until": T0, "concurrency_key": "a"}])
    db[Q].answer("aggregate", [{"_id": "b", "running": 2}], [{"_id": "b"}, {"_id": "a"}],
                 [{"_id": "b", "running": 2, "ready": 0}, {"_id": "a", "running": 0, "ready": 2}])
    db[Q].answer("find_one_and_update", job("u1"), job("a1"))
    # When it claims up to 3
    jobs = store.claim("q", "w", 3, 60, KEYS)
    # Then the walk of key a takes a's own job; the job moving to no key comes as unkeyed
    assert claimed_ids(db) == ["u1", "a1"] and len(jobs) == 2


def test_claim_one_counts_a_lapsed_job_under_its_new_revisions_key(db, store):
    db[LIMITS].answer("find_one_and_update", gate())
    db[Q].answer("find_one", moving("m1", "a", "b"))
    db[Q].answer("count_documents", 1)
    assert store.claim_one("q", "m1", "w", 60, ClaimLimits(key_limit=1)) is None
    (count,) = db.of(Q, "count_documents")
    assert count[0][0]["concurrency_key"] == "b"


@pytest.mark.parametrize("lease_until, running", [
    (T0 + timedelta(seconds=1), True), (T0, True), (T0 - timedelta(seconds=1), False)])
def test_held_backs_key_counts_leave_a_lapsed_lease_out_of_the_running(lease_until, running):
    # The claim's key walk counts it (its slot stays taken until the sweep); held_back does
    # not: the lapsed job is ready itself, and an autoscaler must start the worker that
    # frees its slot
    doc = {"_id": "j", "concurrency_key": "a", "status": "processing",
           "lease_until": lease_until, "attempts": 1}
    held = documents.key_counts(0, lapsed_free=True)[1]["$group"]["running"]["$sum"]["$cond"][0]
    claim = documents.key_counts(0, processing_only=True)[1]["$group"]["running"]["$sum"]
    assert truthy(evaluate(held, doc, T0)) is running
    assert truthy(evaluate(claim["$cond"][0], doc, T0)) is True
