"""The outbox: which ready jobs are owed a publish, and how a dispatcher's confirm is fenced."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from leaseq.job import Job
from leaseq.testing.harness import (
    W1,
    FreshStore,
    advance,
    advance_past,
    events,
    leases,
    must_get,
)


def _reclaim(q: Any, job: Job) -> None:
    assert job.lease_until is not None, "a claimed job carries its lease"
    advance_past(q.store, job.lease_until)
    assert q.reclaim_expired() == (0, 1)


#: Every way a claimed job goes back to pending (DESIGN.md §3).
BACK_TO_PENDING: dict[str, Callable[[Any, Job], Any]] = {
    "retry_later": lambda q, job: q.retry_later(job, "transient", delay_s=0),
    "snooze": lambda q, job: q.snooze(job, 0),
    "give_back-unstarted": lambda q, job: q.give_back(job, started=False),
    "give_back-started": lambda q, job: q.give_back(job, started=True),
    "stale-complete": lambda q, job: (q.enqueue("j1", {"v": 2}, revision="r2"),
                                      q.complete(job)),
    "reclaim": _reclaim,
    "operator-requeue": lambda q, job: (q.fail(job, "bad"), q.requeue("j1")),
    "revive": lambda q, job: (q.complete(job), q.enqueue("j1", {"v": 2}, revision="r2")),
}

#: Changes that leave a pending job pending, or bring it back there, without a claim: the
#: epoch stays, so only the job's ``updated_at`` tells the state a message was published for.
CHANGED_WHILE_PENDING: dict[str, Callable[[Any], Any]] = {
    "cancel-requeue": lambda q: (q.cancel("j1"), q.requeue("j1")),
    "new-revision-delayed": lambda q: q.enqueue("j1", {"v": 2}, revision="r2", delay_s=0.5),
}



def assert_still_owed_after_confirming(q: Any, read: Job) -> None:
    """A confirm of ``read`` (as ``outbox_due`` gave it) marks nothing: the job is still owed."""
    assert q.mark_published([read]) == 0
    assert must_get(q, read.id).published_at is None
    assert [j.id for j in q.outbox_due()] == [read.id]

class OutboxSuite:
    def test_outbox_lists_due_unpublished_jobs(self, leaseq_store: FreshStore) -> None:
        # Given two due jobs and a delayed one
        q = leaseq_store.queue()
        q.enqueue("first", {})
        q.enqueue("second", {})
        q.enqueue("delayed", {}, delay_s=600)
        assert [j.id for j in q.outbox_due()] == ["first", "second"]
        # When the first is published, Then it is no longer owed; marking twice counts once
        assert q.mark_published(leases(q, "first", "missing")) == 1
        assert q.mark_published(leases(q, "first")) == 0
        assert [j.id for j in q.outbox_due()] == ["second"]
        assert must_get(q, "first").published_at is not None
        assert "published" in events(q.journal("first"))

    def test_prepare_outbox_is_idempotent_and_changes_no_answer(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given jobs owed a publish, one published, and one not yet due
        q = leaseq_store.queue()
        for job_id in ("first", "published", "second"):
            q.enqueue(job_id, {})
        q.enqueue("delayed", {}, delay_s=600)
        assert q.mark_published(leases(q, "published")) == 1
        # When a dispatcher prepares the outbox (twice: two dispatchers, or a restart)
        leaseq_store.store.prepare_outbox()
        leaseq_store.store.prepare_outbox()
        # Then the outbox owes what it owed, and still follows every later change
        assert [j.id for j in q.outbox_due()] == ["first", "second"]
        q.enqueue("third", {})
        assert q.mark_published(leases(q, "first")) == 1
        assert [j.id for j in q.outbox_due()] == ["second", "third"]

    def test_republish_owes_again_what_was_published_long_ago(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a job published ten minutes ago and never consumed (its message was lost),
        # one published just now, and one published then claimed
        q = leaseq_store.queue()
        for job_id in ("lost", "fresh", "taken"):
            q.enqueue(job_id, {})
        assert q.mark_published(leases(q, "lost", "taken")) == 2
        q.claim_one("taken", W1)
        advance(leaseq_store.store, 600)
        assert q.mark_published(leases(q, "fresh")) == 1
        # When the operator republishes what was published over five minutes ago
        cleared = q.republish(300)
        # Then only the lost one is owed again
        assert cleared == 1
        assert [j.id for j in q.outbox_due()] == ["lost"]
        assert q.republish(300) == 0

    def test_a_stale_dispatcher_cannot_mark_a_retry_not_yet_due(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a job published, claimed, and sent back for a retry in ten minutes
        q = leaseq_store.queue()
        q.enqueue("j1", {})
        assert q.mark_published(leases(q, "j1")) == 1
        (job,) = q.claim(W1, lease_s=60)
        q.retry_later(job, "flaky", delay_s=600)
        # When a dispatcher confirms a publish of the retry before it is due
        marked = q.mark_published(leases(q, "j1"))
        # Then the not-yet-due retry is still owed: its own publish comes when it is due
        assert marked == 0 and must_get(q, "j1").published_at is None
        advance(leaseq_store.store, 601)
        assert [j.id for j in q.outbox_due()] == ["j1"]

    def test_a_late_confirm_cannot_mark_a_later_pending_state(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a dispatcher that read a job from the outbox and published it
        q = leaseq_store.queue()
        q.enqueue("j1", {})
        (read,) = q.outbox_due()
        # ... while a polling worker claimed the job and gave it back, due at once
        (job,) = q.claim(W1, lease_s=60)
        q.snooze(job, 0)
        # When the dispatcher's confirm for the state it read comes back, Then the later
        # pending state (no message behind it) is still owed a publish
        assert_still_owed_after_confirming(q, read)

    @pytest.mark.parametrize("change", sorted(CHANGED_WHILE_PENDING))
    def test_a_late_confirm_cannot_mark_a_state_changed_without_a_claim(
        self, leaseq_store: FreshStore, change: str
    ) -> None:
        # Given a dispatcher that read a job from the outbox and published it
        q = leaseq_store.queue()
        q.enqueue("j1", {}, revision="r1")
        (read,) = q.outbox_due()
        # ... while the job changed and came back due at the same epoch (its consumer may
        # have acked the message meanwhile as not claimable: cancelled, or not due yet)
        advance(leaseq_store.store, 1)
        CHANGED_WHILE_PENDING[change](q)
        advance(leaseq_store.store, 1)
        assert must_get(q, "j1").lease_epoch == read.lease_epoch
        # When the dispatcher's confirm for the state it read comes back, Then the changed
        # state, which no message stands for, is still owed a publish
        assert_still_owed_after_confirming(q, read)

    @pytest.mark.parametrize("how", sorted(BACK_TO_PENDING))
    def test_every_return_to_pending_owes_a_new_publish(
        self, leaseq_store: FreshStore, how: str
    ) -> None:
        # Given a job whose ready state was published, then claimed
        q = leaseq_store.queue()
        q.enqueue("j1", {}, revision="r1")
        assert q.mark_published(leases(q, "j1")) == 1
        (job,) = q.claim(W1, lease_s=60)
        assert q.mark_published(leases(q, "j1")) == 0  # processing: nothing to publish
        # When it comes back to pending, Then the outbox owes a publish again
        BACK_TO_PENDING[how](q, job)
        back = must_get(q, "j1")
        assert (back.status, back.published_at) == ("pending", None)
        advance(leaseq_store.store, 1)
        assert [j.id for j in q.outbox_due()] == ["j1"]
