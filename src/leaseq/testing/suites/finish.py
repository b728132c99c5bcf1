"""Finishing: complete with results and app statuses, follow-up jobs, and quarantine."""

from __future__ import annotations

import pytest

from leaseq.errors import InvalidInput, InvalidPayload
from leaseq.job import Job, LeaseLost
from leaseq.testing.harness import W1, FreshStore, events, given_claimed, given_stolen, must_get


class FinishSuite:
    def test_complete_saves_result_and_clears_the_lease(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        job = given_claimed(q)
        done = q.complete(job, {"pages": 3}, result_key="s3://bucket/out/j1.json")
        stored = must_get(q, job.id)
        assert stored == done
        assert (stored.status, stored.result, stored.result_key) == (
            "done", {"pages": 3}, "s3://bucket/out/j1.json")
        assert (stored.lease_until, stored.failure) == (None, None)
        assert q.claim(W1) == [] and q.ready() == 0
        assert (events(q.journal(job.id))[-1], q.journal(job.id)[-1].reason) == (
            "result_saved", "done")

    def test_complete_with_an_app_terminal_status(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        job = given_claimed(q)
        q.complete(job, {"bytes": 10**10}, status="skipped_too_large", result_key="why/j1")
        stored = must_get(q, job.id)
        assert (stored.status, stored.result, stored.result_key) == (
            "skipped_too_large", {"bytes": 10**10}, "why/j1")
        assert q.counts() == {"skipped_too_large": 1}
        assert q.is_finished(job.id)
        assert q.claim(W1) == []

    def test_complete_refuses_a_live_status_or_bad_result(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        job = given_claimed(q)
        before = must_get(q, job.id)
        with pytest.raises(InvalidInput):
            q.complete(job, status="pending")
        with pytest.raises(InvalidPayload):
            q.complete(job, {"x": float("nan")})
        assert must_get(q, job.id) == before

    def test_complete_writes_follow_ups_with_it(self, leaseq_store: FreshStore) -> None:
        # Given a job, another queue, and a follow-up id that already exists
        q, other = leaseq_store.queue(), leaseq_store.queue("thumbs")
        job = given_claimed(q)
        q.enqueue("next-2", {"old": True})
        # When it completes with follow-ups in its own queue and the other one
        q.complete(job, then=[q.spec("next-1", {"n": 1}), q.spec("next-2", {"new": True}),
                              ("thumbs", other.spec("thumb-1", {"n": 2}))])
        # Then they exist, pending; an existing one is kept as it was (no conflict raised)
        assert must_get(q, "next-1").status == "pending"
        assert must_get(q, "next-2").payload == {"old": True}
        assert must_get(other, "thumb-1").payload == {"n": 2}
        assert events(other.journal("thumb-1")) == ["enqueued"]

    def test_fenced_out_complete_writes_no_follow_ups(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        old, _ = given_stolen(q)
        with pytest.raises(LeaseLost):
            q.complete(old, then=[q.spec("next-1", {})])
        assert q.get("next-1") is None
        assert leaseq_store.store.queues() == ["jobs"]

    def test_complete_many_fences_each_item_on_its_own(self, leaseq_store: FreshStore) -> None:
        # Given three held jobs, one made stale by a new revision, and one stolen lease
        q = leaseq_store.queue()
        held = [given_claimed(q, f"m{i}") for i in range(3)]
        q.enqueue("m2", {"name": "m2"}, revision="r2")
        old, new = given_stolen(q, "m-stolen")
        # When they are completed in one batch, the stolen job under both its leases
        out = q.complete_many([(held[0], {"n": 0}), held[1], held[2], old, (new, {"n": 9})])
        # Then each item got its own outcome, in order: the old lease lost, the new one done
        assert [type(o).__name__ for o in out] == ["Job", "Job", "Job", "LeaseLost", "Job"]
        assert [o.status for o in out[:3] if isinstance(o, Job)] == ["done", "done", "pending"]
        assert must_get(q, "m0").result == {"n": 0}
        assert must_get(q, "m2").attempts == 0  # the stale finish restarted the new revision
        stolen = must_get(q, "m-stolen")
        assert (stolen.status, stolen.result, stolen.lease_epoch) == ("done", {"n": 9}, 2)
        assert out[4] == stolen
        assert events(q.journal("m1"))[-1] == "result_saved"
        assert events(q.journal("m2"))[-1] == "given_back"
        assert q.complete_many([]) == []

    def test_fail_quarantines_with_its_reason(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        job = given_claimed(q)
        failed = q.fail(job, KeyError("size"), failure="invalid")
        stored = must_get(q, job.id)
        assert stored == failed
        assert (stored.status, stored.failure, stored.lease_until) == ("failed", "invalid", None)
        assert stored.error == "KeyError: 'size'"
        assert events(q.journal(job.id))[-1] == "quarantined"
        assert q.claim(W1) == []

    def test_unknown_failure_kind_is_refused(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        job = given_claimed(q)
        with pytest.raises(InvalidInput):
            q.fail(job, "boom", failure="whatever")
        assert must_get(q, job.id).status == "processing"
