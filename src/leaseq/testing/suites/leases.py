"""Leases: heartbeats, fencing of an old holder, expiry and ``reclaim_expired``."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import pytest

from leaseq.browse import BulkAction
from leaseq.job import Lease, LeaseLost
from leaseq.queue import Queue
from leaseq.testing.harness import (
    LONG_LEASE_S,
    W1,
    W2,
    FreshStore,
    advance,
    advance_past,
    events,
    given_claimed,
    given_stolen,
    must_get,
    within_readings,
)

#: The writes an old holder may try after its lease was taken; each must raise LeaseLost.
FENCED_WRITES: dict[str, Callable[[Queue, Any], Any]] = {
    "complete": lambda q, job: q.complete(job, {"r": 1}),
    "retry_later": lambda q, job: q.retry_later(job, "boom", delay_s=0),
    "snooze": lambda q, job: q.snooze(job, 0),
    "give_back": lambda q, job: q.give_back(job, started=True),
    "fail": lambda q, job: q.fail(job, "boom"),
}


class LeaseSuite:
    def test_heartbeat_keeps_the_lease_past_its_first_end(self, leaseq_store: FreshStore) -> None:
        # Given a job claimed with a 60 s lease, 40 s later
        q = leaseq_store.queue()
        job = given_claimed(q, lease_s=60)
        advance(leaseq_store.store, 40)
        # When the worker beats
        before = leaseq_store.store.server_now()
        assert q.heartbeat([job], lease_s=60) == []
        after = leaseq_store.store.server_now()
        # Then the lease runs 60 s from the beat, so 30 s later still nobody else can claim it
        renewed = must_get(q, job.id)
        assert renewed.lease_until is not None
        assert within_readings(60, 60, shortest=(renewed.lease_until - after).total_seconds(),
                               longest=(renewed.lease_until - before).total_seconds())
        advance(leaseq_store.store, 30)
        assert q.claim(W2) == []
        assert (renewed.lease_epoch, renewed.worker_id) == (job.lease_epoch, W1)

    def test_heartbeat_returns_only_lost_leases_in_given_order(
        self, leaseq_store: FreshStore
    ) -> None:
        q = leaseq_store.queue()
        held = given_claimed(q, "held")
        old, _ = given_stolen(q, "stolen")
        gone = Lease("never-existed", 1)
        assert q.heartbeat([gone, held, old]) == ["never-existed", "stolen"]
        assert q.heartbeat([]) == []

    def test_expired_lease_is_taken_by_the_next_claim(self, leaseq_store: FreshStore) -> None:
        # Given W1's claim whose lease ran out (no sweeper ran); When W2 claims
        q = leaseq_store.queue()
        old, new = given_stolen(q)
        # Then W2 holds it under a new epoch, and the attempt is counted again
        assert (new.worker_id, new.lease_epoch, new.attempts) == (W2, old.lease_epoch + 1, 2)
        claims = [e for e in q.journal(new.id) if e.event == "claimed"]
        assert [(e.worker_id, e.lease_epoch) for e in claims] == [(W1, 1), (W2, 2)]
        assert claims[1].reason == "redelivered"

    def test_old_holders_heartbeat_is_lost_and_resurrects_nothing(
        self, leaseq_store: FreshStore
    ) -> None:
        q = leaseq_store.queue()
        old, new = given_stolen(q)
        # When the old holder beats
        assert q.heartbeat([old], lease_s=LONG_LEASE_S * 10) == [old.id]
        # Then the new holder's lease, worker and epoch are as they were
        now = must_get(q, old.id)
        assert (now.status, now.worker_id, now.lease_epoch) == ("processing", W2, 2)
        assert now.lease_until == new.lease_until
        assert "heartbeat_lost" in events(q.journal(old.id))

    @pytest.mark.parametrize("write", sorted(FENCED_WRITES))
    def test_old_holders_write_raises_lease_lost_and_changes_nothing(
        self, leaseq_store: FreshStore, write: str
    ) -> None:
        # Given a job whose lease W2 took from W1
        q = leaseq_store.queue()
        old, new = given_stolen(q)
        before = must_get(q, old.id)
        # When W1 tries to finish it, Then it is refused and the record is untouched
        with pytest.raises(LeaseLost):
            FENCED_WRITES[write](q, old)
        assert must_get(q, old.id) == before
        # And the new holder still finishes normally
        assert q.complete(new).status == "done"

    @pytest.mark.parametrize("write", sorted(FENCED_WRITES))
    def test_a_lease_whose_token_no_claim_stamped_is_fenced_out_typed(
        self, leaseq_store: FreshStore, write: str
    ) -> None:
        # Given a job W1 claimed, and a copy of its lease with a token no claim of this store
        # stamped (made by hand, or another store's: not even a UUID)
        q = leaseq_store.queue()
        job = given_claimed(q, "j1", W1)
        stranger = dataclasses.replace(job, claim_token="not-a-claim-token")
        before = must_get(q, "j1")
        # When it beats and writes, Then it is lost and refused as any stranger is (LeaseLost,
        # not a driver's error), and the record is untouched
        assert q.heartbeat([stranger]) == ["j1"]
        with pytest.raises(LeaseLost):
            FENCED_WRITES[write](q, stranger)
        (refused,) = q.complete_many([stranger])
        assert isinstance(refused, LeaseLost)
        assert must_get(q, "j1") == before
        # And the claim itself still finishes
        assert q.complete(job).status == "done"

    @pytest.mark.parametrize("write", sorted(FENCED_WRITES))
    @pytest.mark.parametrize("claimer", [W2, W1], ids=["another_worker", "the_same_worker"])
    def test_holder_of_a_deleted_job_cannot_write_to_the_job_enqueued_again(
        self, leaseq_store: FreshStore, write: str, claimer: str
    ) -> None:
        # Given W1 running j1 when an operator cancels and deletes it, enqueues j1 again and
        # W2, or W1 itself in another slot, claims the new job: a new record starts its
        # epochs again, so the new claim repeats W1's epoch (and, by W1, its worker)
        q = leaseq_store.queue()
        old = given_claimed(q, "j1", W1)
        assert q.cancel("j1")
        deleted = leaseq_store.store.act_on_jobs(q.name, BulkAction.DELETE, ["j1"], "bob")
        assert deleted.acted == ["j1"]
        q.enqueue("j1", {"life": 2})
        (new,) = q.claim(claimer, lease_s=LONG_LEASE_S)
        assert (new.id, new.lease_epoch, new.worker_id) == (old.id, old.lease_epoch, claimer)
        before = must_get(q, "j1")
        # When W1's old claim, which has not noticed, beats and finishes, Then every write is
        # refused and the new job is untouched
        assert q.heartbeat([old]) == ["j1"]
        with pytest.raises(LeaseLost):
            FENCED_WRITES[write](q, old)
        (refused,) = q.complete_many([old])
        assert isinstance(refused, LeaseLost)
        assert must_get(q, "j1") == before
        # And the new claim holds it and finishes it, in a batch with the old one's result
        assert q.heartbeat([old, new]) == ["j1"]
        assert q.heartbeat([new]) == []
        refused, done = q.complete_many([(old, {"life": 1}), (new, {"life": 2})])
        assert isinstance(refused, LeaseLost)
        assert not isinstance(done, LeaseLost)
        assert (done.status, must_get(q, "j1").result) == ("done", {"life": 2})

    def test_worker_that_never_finishes_fails_expired_after_max_attempts_claims(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a job whose every worker dies, re-taken by the claim's expired-lease branch
        q = leaseq_store.queue(max_attempts=3)
        q.enqueue("j1", {})
        for attempt in (1, 2, 3):
            (job,) = q.claim(f"host:{attempt}:dead{attempt:04d}", lease_s=60)
            assert job.attempts == attempt
            advance_past(leaseq_store.store, job.lease_until)
        # Then the spent job is not claimable, and reclaim quarantines it
        assert q.claim(W1) == []
        assert q.ready() == 0
        assert q.reclaim_expired() == (1, 0)
        _assert_failed_expired(q, "j1", claims=3)

    def test_worker_that_never_finishes_fails_expired_via_reclaim_expired(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a job whose every worker dies, and a sweeper between claims
        q = leaseq_store.queue(max_attempts=3)
        q.enqueue("j1", {})
        for attempt in (1, 2, 3):
            (job,) = q.claim(W1, lease_s=60)
            assert job.attempts == attempt
            advance_past(leaseq_store.store, job.lease_until)
            expected = (1, 0) if attempt == 3 else (0, 1)
            assert q.reclaim_expired() == expected
        _assert_failed_expired(q, "j1", claims=3)

    def test_reclaim_quarantines_spent_and_returns_the_rest_ready(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given an expired job with attempts left, one without, and one live lease
        q = leaseq_store.queue()
        spent = given_claimed(q, "spent", lease_s=60, max_attempts=1)
        left = given_claimed(q, "left", lease_s=60, max_attempts=2)
        given_claimed(q, "live", lease_s=LONG_LEASE_S)
        assert spent.lease_until is not None and left.lease_until is not None
        advance_past(leaseq_store.store, max(spent.lease_until, left.lease_until))
        # When reclaimed
        assert q.reclaim_expired() == (1, 1)
        # Then
        _assert_failed_expired(q, "spent", claims=1)
        back = must_get(q, "left")
        assert (back.status, back.attempts) == ("pending", 1)
        assert [j.id for j in q.claim(W2)] == ["left"]
        assert must_get(q, "live").status == "processing"
        assert "reclaimed" in events(q.journal("left"))
        assert q.reclaim_expired() == (0, 0)

    def test_spent_expired_job_is_never_claimable_while_reclaim_runs(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given 30 spent expired jobs and 30 expired jobs with attempts left
        q = leaseq_store.queue()
        spent = _expired_jobs(q, "spent", max_attempts=1)
        _expired_jobs(q, "left", max_attempts=2)
        advance(leaseq_store.store, 61)
        # When 4 threads claim without pause while reclaim runs
        taken = _claim_during(q, q.reclaim_expired)
        # Then no spent job was ever handed out; all ended failed(expired)
        assert not set(taken) & set(spent)
        assert q.counts()["failed"] == len(spent)
        assert all(must_get(q, job_id).failure == "expired" for job_id in spent)


def _expired_jobs(q: Queue, prefix: str, max_attempts: int) -> list[str]:
    ids = [f"{prefix}-{i:03d}" for i in range(30)]
    q.enqueue_many([q.spec(job_id, {}, max_attempts=max_attempts) for job_id in ids])
    claimed = q.claim(W1, limit=len(ids), lease_s=60)
    assert sorted(j.id for j in claimed) == ids
    return ids


def _claim_during(q: Queue, action: Callable[[], Any], threads: int = 4) -> list[str]:
    """Run ``action`` while ``threads`` claimers loop; all ids they took."""
    stop = threading.Event()
    start = threading.Barrier(threads + 1)
    taken: list[str] = []

    def claimer(i: int) -> None:
        start.wait(timeout=30)
        while not stop.is_set():
            taken.extend(j.id for j in q.claim(f"host:{i}:claim{i:03d}", limit=3))

    workers = [threading.Thread(target=claimer, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    start.wait(timeout=30)
    try:
        action()
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=60)
    return taken


def _assert_failed_expired(q: Queue, job_id: str, claims: int) -> None:
    job = must_get(q, job_id)
    assert (job.status, job.failure, job.attempts) == ("failed", "expired", claims)
    journal = q.journal(job_id)
    assert events(journal).count("claimed") == claims
    assert events(journal)[-1] == "quarantined"
