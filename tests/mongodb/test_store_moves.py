"""What ``reclaim_expired`` counts and journals when another caller moves a job between the
sweeper's read and its ``update_many``: a second sweeper (every worker runs one) or the
worker's own give-back or retry, all of which keep the lease epoch; and when the store fails
between its statements, or the backlog is larger than one command should carry.
Store-specific: the race and the failure fall between two statements of ``MongoStore._move``,
which only a fake can stop at; here the job collection runs its finds and updates through
pipeline_model, so the store's real documents decide what each statement matches and writes.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from mongo_fakes import FakeCollection, FakeDB, Updated, bound
from pipeline_model import matches, run
from pymongo import ReturnDocument
from pymongo.errors import AutoReconnect

from leaseq import validate
from leaseq.errors import InvalidPayload, StoreUnavailable
from leaseq.job import Lease
from leaseq.stores.base import PURGE_BATCH
from leaseq.stores.mongodb import MongoStore, records

Q = "leaseq_q"
NOW = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)


class ModelCollection(FakeCollection):
    """A job collection that holds documents: ``find``, ``update_many`` and
    ``find_one_and_update`` are recorded as the fake records them and evaluated on
    ``docs``. ``racer``, when set, runs once just before the next ``update_many``."""

    def __init__(self, name: str, calls: list[Any]):
        super().__init__(name, calls)
        self.docs: dict[str, dict[str, Any]] = {}
        self.racer: Callable[[], None] | None = None

    def find(self, *a: Any, **k: Any) -> list[Any]:
        self._call("find", a, k, [])
        given = bound("find", a, k)
        found = [d for d in self.docs.values() if matches(given["filter"] or {}, d, NOW)]
        projection, limit = given["projection"], given["limit"]
        return [dict(d) if projection is None
                else {f: d[f] for f in d if f == "_id" or f in projection}
                for d in found[:limit or None]]

    def update_many(self, *a: Any, **k: Any) -> Any:
        racer, self.racer = self.racer, None
        if racer is not None:
            racer()
        self._call("update_many", a, k, None)
        given = bound("update_many", a, k)
        hit = [i for i, d in self.docs.items() if matches(given["filter"], d, NOW)]
        for i in hit:
            self.docs[i] = run(given["update"], self.docs[i], NOW)
        return Updated(len(hit))

    def find_one_and_update(self, *a: Any, **k: Any) -> Any:
        self._call("find_one_and_update", a, k, None)
        given = bound("find_one_and_update", a, k)
        for i, d in self.docs.items():
            if matches(given["filter"], d, NOW):
                self.docs[i] = run(given["update"], d, NOW)
                after = given["return_document"] == ReturnDocument.AFTER
                return dict(self.docs[i] if after else d)
        return None


@pytest.fixture
def jobs(db: FakeDB) -> ModelCollection:
    db.collections[Q] = ModelCollection(Q, db.calls)
    return db.collections[Q]  # type: ignore[return-value]


def expired(job_id: str, **fields: Any) -> dict[str, Any]:
    return {"_id": job_id, "status": "processing", "attempts": 1, "max_attempts": 5,
            "lease_epoch": 4, "worker_id": "w", "stale": False,
            "lease_until": NOW - timedelta(seconds=10), "updated_at": NOW, **fields}


def journal(db: FakeDB) -> list[tuple[str, str]]:
    return [(op._doc[0]["$set"]["job_id"]["$literal"], op._doc[0]["$set"]["event"]["$literal"])
            for args, _ in db.of("leaseq_journal", "bulk_write") for op in args[0]]


def test_two_sweepers_racing_count_and_journal_each_job_once(db, jobs, store):
    # Given an expired job and a second sweeper that reclaims it after this one read it
    jobs.docs["a"] = expired("a")
    other = MongoStore(db, url="mongodb://db.example/leaseq")
    seen: list[tuple[int, int]] = []
    jobs.racer = lambda: seen.append(other.reclaim_expired("q"))
    # When this sweeper's update comes second
    mine = store.reclaim_expired("q")
    # Then the job was reclaimed once: by the other sweeper, not by this one
    assert seen == [(0, 1)] and mine == (0, 0)
    assert journal(db) == [("a", "reclaimed")]
    assert (jobs.docs["a"]["status"], jobs.docs["a"]["attempts"]) == ("pending", 1)


def test_a_give_back_between_the_read_and_the_update_is_not_counted_as_reclaimed(
        db, jobs, store):
    # Given an expired lease whose worker gives the job back after the sweeper read it
    jobs.docs["a"] = expired("a")
    jobs.docs["b"] = expired("b", worker_id="v")
    jobs.racer = lambda: store.give_back("q", Lease("a", 4, "w"), False, "shutting down")
    # When the sweeper's update runs
    # Then it counts and journals only the job it returned
    assert store.reclaim_expired("q") == (0, 1)
    assert journal(db) == [("a", "given_back"), ("b", "reclaimed")]
    assert jobs.docs["a"]["attempts"] == 0  # the give-back's refund, not the sweeper's state


def test_an_exhausted_retry_between_the_read_and_the_update_is_not_quarantined_again(
        db, jobs, store):
    # Given an expired lease with its attempts spent whose worker's retry lands first
    jobs.docs["a"] = expired("a", attempts=5)
    jobs.racer = lambda: store.retry_later("q", Lease("a", 4, "w"), "boom", "error", 5.0)
    # Then the job is failed(exhausted) by the worker, not quarantined(expired) as well
    assert store.reclaim_expired("q") == (0, 0)
    assert journal(db) == [("a", "quarantined")]
    assert jobs.docs["a"]["failure"] == "exhausted"


def test_the_move_token_is_a_record_field_never_payload(db, jobs, store):
    # Given a job the sweeper reclaimed, so its document carries this call's token
    jobs.docs["a"] = expired("a", name="clip.mp4")
    assert store.reclaim_expired("q") == (0, 1)
    assert "moved_by" in jobs.docs["a"]
    # Then the job a user reads has only its own payload, and no payload may use the name
    assert records.job("q", jobs.docs["a"]).payload == {"name": "clip.mp4"}
    with pytest.raises(InvalidPayload):
        validate.payload({"moved_by": 1}, 1000)


def test_a_failure_in_a_later_step_leaves_the_earlier_steps_moves_journalled(db, store):
    # Given an expired job with its attempts spent, and a server lost after step 1 moved it
    db[Q].answer("find", [expired("a", attempts=5)], AutoReconnect("step 2's read"))
    db[Q].answer("update_many", Updated(1))
    # When the sweep fails in step 2
    with pytest.raises(StoreUnavailable):
        store.reclaim_expired("q")
    # Then step 1's move stands with its journal entry
    assert len(db.of(Q, "update_many")) == 1
    assert journal(db) == [("a", "quarantined")]


def test_a_failure_after_a_chunk_leaves_that_chunk_journalled(db, store):
    # Given a full chunk of expired jobs, and a server lost when the next chunk is read
    db[Q].answer("find", [expired(f"j{n}") for n in range(PURGE_BATCH)],
                 AutoReconnect("the second chunk's read"))
    db[Q].answer("update_many", Updated(PURGE_BATCH))
    with pytest.raises(StoreUnavailable):
        store.reclaim_expired("q")
    # Then the chunk moved before the failure is journalled
    assert len(journal(db)) == PURGE_BATCH


def test_a_backlog_larger_than_a_batch_is_moved_in_bounded_chunks(db, jobs, store):
    # Given more expired jobs than one batch
    for n in range(PURGE_BATCH + 5):
        jobs.docs[f"j{n:05}"] = expired(f"j{n:05}")
    # When the sweeper reclaims them
    assert store.reclaim_expired("q") == (0, PURGE_BATCH + 5)
    # Then each update_many names at most a batch of ids, each chunk journalled after it
    sizes = [len(a[0]["_id"]["$in"]) for a, _ in db.of(Q, "update_many")]
    assert sizes == [PURGE_BATCH, 5]
    assert all(k["limit"] == PURGE_BATCH for _, k in db.of(Q, "find"))
    writes = [m for _, m, _, _ in db.calls if m in ("update_many", "bulk_write")]
    assert writes == ["update_many", "bulk_write", "update_many", "bulk_write"]
    assert [len(a[0]) for a, _ in db.of("leaseq_journal", "bulk_write")] == [PURGE_BATCH, 5]
    assert {d["status"] for d in jobs.docs.values()} == {"pending"}
