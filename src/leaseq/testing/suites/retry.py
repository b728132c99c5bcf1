"""Retry and snooze: backoff bounds, the attempt budget, the snooze's default delay and bound,
error text, and the stale revision."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

from leaseq.errors import InvalidInput
from leaseq.job import Job
from leaseq.queue import Queue
from leaseq.testing.harness import (
    W1,
    W2,
    FreshStore,
    advance_past,
    events,
    given_claimed,
    must_get,
    set_clock_before,
    within_readings,
)
from leaseq.validate import MAX_ERROR_CHARS


def _one_of_many(q: Queue, job: Job) -> Job:
    (finished,) = q.complete_many([(job, {"r": 1})])
    assert isinstance(finished, Job), finished
    return finished


#: A worker's finishing writes; on a stale job each one must become a give-back that starts
#: the new revision afresh.
FINISHES: dict[str, Callable[[Queue, Job], Job]] = {
    "complete": lambda q, job: q.complete(job, {"r": 1}, then=[q.spec("follow-up", {})]),
    "complete_many": lambda q, job: _one_of_many(q, job),
    "retry_later": lambda q, job: q.retry_later(job, "boom", delay_s=300),
    "fail": lambda q, job: q.fail(job, "boom"),
    "snooze": lambda q, job: q.snooze(job, 300),
    "give_back": lambda q, job: q.give_back(job, started=True),
}


def _not_before_delay(store: Any, job: Job, call: Callable[[], Job]) -> tuple[Job, float, float]:
    """Run ``call``; its job and the range its not-before can be from the store's now."""
    before = store.server_now()
    after_job = call()
    after = store.server_now()
    assert after_job.lease_until is not None
    return (after_job, (after_job.lease_until - after).total_seconds(),
            (after_job.lease_until - before).total_seconds())


class RetrySuite:
    def test_retry_later_uses_policy_backoff_within_bounds(self, leaseq_store: FreshStore) -> None:
        # Given base 100 s, cap 250 s: attempt n waits min(100·2^(n−1), 250)·[1, 1.5]
        q = leaseq_store.queue(max_attempts=5, backoff_base_s=100, backoff_cap_s=250)
        q.enqueue("j1", {})
        for n, low in ((1, 100.0), (2, 200.0), (3, 250.0), (4, 250.0)):
            (job,) = q.claim(W1)
            assert job.attempts == n
            # When the worker asks for a retry with the policy's delay
            back, shortest, longest = _not_before_delay(
                leaseq_store.store, job, functools.partial(q.retry_later, job, "try again"))
            # Then not-before lands in the band, it is not claimable just before, and is after
            assert back.status == "pending"
            assert within_readings(low, 1.5 * low, shortest=shortest, longest=longest)
            set_clock_before(leaseq_store.store, back.lease_until)
            assert q.claim(W2) == [] and q.ready() == 0
            advance_past(leaseq_store.store, back.lease_until)

    def test_retry_later_with_explicit_delay(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        job = given_claimed(q)
        back, shortest, longest = _not_before_delay(
            leaseq_store.store, job, lambda: q.retry_later(job, "later", delay_s=42))
        assert within_readings(42, 42, shortest=shortest, longest=longest)
        assert (back.attempts, back.error) == (1, "later")
        assert events(q.journal(job.id))[-1] == "retry_scheduled"

    def test_retry_later_on_last_attempt_fails_exhausted(self, leaseq_store: FreshStore) -> None:
        # Given a job on its last attempt
        q = leaseq_store.queue(max_attempts=2)
        q.enqueue("j1", {})
        q.retry_later(q.claim(W1)[0], "first", delay_s=0)
        (job,) = q.claim(W1)
        # When it asks for another retry, Then it is quarantined as exhausted
        done = q.retry_later(job, ValueError("second"))
        assert (done.status, done.failure, done.attempts) == ("failed", "exhausted", 2)
        assert done.error == "ValueError: second"
        assert events(q.journal("j1"))[-1] == "quarantined"
        assert q.claim(W1) == []

    @pytest.mark.parametrize("how", ["retry_later", "fail"])
    def test_error_text_kept_as_its_last_2000_characters(
        self, leaseq_store: FreshStore, how: str
    ) -> None:
        q = leaseq_store.queue()
        job = given_claimed(q)
        error = "HEAD" + "x" * 5000 + "TAIL"
        after = (q.retry_later(job, error, delay_s=0) if how == "retry_later"
                 else q.fail(job, error))
        stored = must_get(q, job.id).error
        assert stored == after.error == error[-MAX_ERROR_CHARS:]
        reason = q.journal(job.id)[-1].reason or ""
        assert "HEAD" not in reason and len(reason) <= 600  # a safe reason, not the whole text

    def test_snooze_gives_the_attempt_back_and_is_ready_now(
        self, leaseq_store: FreshStore
    ) -> None:
        q = leaseq_store.queue()
        job = given_claimed(q)
        back = q.snooze(job, 0)
        assert (back.status, back.attempts, back.snoozes, back.givebacks) == ("pending", 0, 1, 0)
        again = q.claim(W2)
        assert [(j.id, j.attempts, j.lease_epoch) for j in again] == [(job.id, 1, 2)]
        assert "snoozed" in events(q.journal(job.id))

    def test_snooze_with_delay_waits(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        job = given_claimed(q)
        back, shortest, longest = _not_before_delay(
            leaseq_store.store, job, lambda: q.snooze(job, 30))
        assert within_readings(30, 30, shortest=shortest, longest=longest)
        set_clock_before(leaseq_store.store, back.lease_until)
        assert q.claim(W1) == []
        advance_past(leaseq_store.store, back.lease_until)
        assert len(q.claim(W1)) == 1

    def test_snooze_without_a_delay_waits_the_policys_snooze_s(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a queue whose snooze_s is 30 s
        q = leaseq_store.queue(snooze_s=30)
        job = given_claimed(q)
        # When the job is snoozed without a delay, Then it waits those 30 s, not 0
        back, shortest, longest = _not_before_delay(leaseq_store.store, job, lambda: q.snooze(job))
        assert within_readings(30, 30, shortest=shortest, longest=longest)
        assert (back.status, back.snoozes) == ("pending", 1)
        assert q.claim(W1) == [] and q.ready() == 0
        assert leaseq_store.queue().policy.snooze_s == 5.0  # the default: a few seconds

    def test_snoozes_are_counted_and_bounded(self, leaseq_store: FreshStore) -> None:
        # Given a queue that allows two snoozes
        q = leaseq_store.queue(max_snoozes=2)
        q.enqueue("j1", {})
        # When the job snoozes twice, Then each is counted and it comes back
        for n in (1, 2):
            back = q.snooze(q.claim(W1)[0], 0)
            assert (back.status, back.snoozes, back.attempts) == ("pending", n, 0)
        # When it snoozes a third time, Then it is quarantined: the condition never cleared
        done = q.snooze(q.claim(W1)[0], 0)
        assert (done.status, done.failure, done.snoozes) == ("failed", "exhausted", 3)
        assert done.error == "snoozed 3 times without finishing"
        last = q.journal("j1")[-1]
        assert (last.event, last.reason) == ("quarantined",
                                             "exhausted: snoozed 3 times without finishing")
        assert q.claim(W1) == [] and must_get(q, "j1") == done

    @pytest.mark.parametrize("finish", sorted(FINISHES))
    def test_finish_of_a_stale_job_is_given_back_for_its_new_revision(
        self, leaseq_store: FreshStore, finish: str
    ) -> None:
        # Given a job on its last attempt, snoozed and given back before, whose payload got a
        # new revision (with another concurrency key) while it was processing
        q = leaseq_store.queue(max_attempts=2)
        q.enqueue("j1", {"v": 1}, revision="r1", concurrency_key="old")
        q.snooze(q.claim(W1)[0], 0)
        q.give_back(q.claim(W1)[0], started=True)
        q.retry_later(q.claim(W1)[0], "transient", delay_s=0)
        (job,) = q.claim(W1)
        assert (job.attempts, job.snoozes, job.givebacks) == (2, 1, 1)
        assert q.enqueue(job.id, {"v": 2}, revision="r2",
                         concurrency_key="new").outcome == "updated"
        marked = must_get(q, job.id)
        assert (marked.status, marked.lease_until, marked.lease_epoch) == (
            "processing", job.lease_until, job.lease_epoch)
        assert marked.concurrency_key == "old"  # the running attempt keeps its key's slot
        # When its worker finishes it (any way)
        back = FINISHES[finish](q, job)
        # Then it is given back: pending, ready now, the new revision's budget untouched, no
        # follow-up written
        assert (back.status, back.attempts, back.snoozes, back.givebacks) == ("pending", 0, 0, 0)
        assert back.concurrency_key == "new"
        assert q.get("follow-up") is None
        (again,) = q.claim(W2)
        assert (again.payload, again.revision, again.attempts) == ({"v": 2}, "r2", 1)
        assert again.concurrency_key == "new"
        assert events(q.journal(job.id))[-2:] == ["given_back", "claimed"]
        assert "stale revision" in (q.journal(job.id)[-2].reason or "")

    @pytest.mark.parametrize("how", ["reclaim", "claim"])
    def test_expired_stale_job_comes_back_for_its_new_revision(
        self, leaseq_store: FreshStore, how: str
    ) -> None:
        # Given a job on its last attempt whose worker died after a new revision arrived
        q = leaseq_store.queue(max_attempts=1)
        job = given_claimed(q, revision="r1", lease_s=60, concurrency_key="old")
        q.enqueue(job.id, {"v": 2}, revision="r2", concurrency_key="new")
        advance_past(leaseq_store.store, job.lease_until)
        # When the lease is reclaimed (or the next claim takes it)
        if how == "reclaim":
            assert q.reclaim_expired() == (0, 1)
            back = must_get(q, job.id)
            assert (back.status, back.concurrency_key) == ("pending", "new")
        # Then the new revision runs, under its own key: the old revision's spent attempt
        # never fails it
        (again,) = q.claim(W2)
        assert (again.revision, again.attempts, again.max_attempts) == ("r2", 1, 1)
        assert again.concurrency_key == "new"

    def test_stale_job_keeps_its_lease_until_finished(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        job = given_claimed(q, revision="r1")
        q.enqueue(job.id, {"v": 2}, revision="r2")
        assert q.heartbeat([job]) == []
        assert q.claim(W2) == []

    def test_bad_delay_is_refused_and_job_unchanged(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        job = given_claimed(q)
        before = must_get(q, job.id)
        with pytest.raises(InvalidInput):
            q.retry_later(job, "boom", delay_s=-1)
        with pytest.raises(InvalidInput):
            q.snooze(job, float("nan"))
        assert must_get(q, job.id) == before
