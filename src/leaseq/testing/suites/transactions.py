"""Transactions: an enqueue rides on the caller's open transaction, and a completion commits
with its follow-ups or not at all. A store whose ``supports_transactions`` is False skips
this suite, with the reason, rather than fail it (as Huey's storage tests read
``destructive_reads``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import pytest

from leaseq.job import FollowUp, JobSpec
from leaseq.testing.harness import FreshStore, events, given_claimed, must_get

NO_TRANSACTIONS = "store has no transactions"


class CallerRolledBack(Exception):
    """Raised by a test inside the caller's transaction, to roll it back."""


class FollowUpFailed(Exception):
    """A follow-up that could not be written, after the completion and another follow-up
    were."""


class _Unwritable(Sequence[JobSpec]):
    """Follow-up specs whose reading fails: the store meets the failure part-way through
    the completion's transaction, whatever it does with the specs first."""

    def __iter__(self) -> Iterator[JobSpec]:
        raise FollowUpFailed("this follow-up cannot be written")

    def __getitem__(self, index: Any) -> Any:
        raise FollowUpFailed("this follow-up cannot be written")

    def __len__(self) -> int:
        return 1


def callers_transaction(fresh: FreshStore) -> AbstractContextManager[Any]:
    """The caller's own open transaction, or skip when the store factory names none."""
    if fresh.transaction is None:
        pytest.skip("the store factory gives no caller's transaction (FreshStore.transaction)")
    return fresh.transaction()


class TransactionSuite:
    @pytest.fixture(autouse=True)
    def _skip_without_transactions(self, leaseq_store: FreshStore) -> None:
        if not leaseq_store.store.supports_transactions:
            pytest.skip(NO_TRANSACTIONS)

    def test_enqueue_in_the_callers_transaction_is_seen_only_after_commit(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a job enqueued through the caller's own open transaction
        q = leaseq_store.queue("mail")
        with callers_transaction(leaseq_store) as conn:
            result = q.enqueue("welcome-1", {"to": "a@example.com"}, connection=conn)
            assert result.outcome == "created"
            # Then nobody else sees it before the commit
            assert q.get("welcome-1") is None
        # When the caller commits, Then the job is there with its journal
        assert must_get(q, "welcome-1").status == "pending"
        assert events(q.journal("welcome-1")) == ["enqueued"]

    def test_enqueue_in_the_callers_transaction_rolls_back_with_it(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a batch enqueued through the caller's transaction, which then rolls back
        q = leaseq_store.queue("mail")
        with pytest.raises(CallerRolledBack), callers_transaction(leaseq_store) as conn:
            q.enqueue_many([q.spec("j1", {}), q.spec("j2", {})], connection=conn)
            raise CallerRolledBack
        # Then no job and no journal entry is left
        assert q.get("j1") is None and q.get("j2") is None
        assert q.journal("j1") == [] and q.journal("j2") == []
        assert q.claim("w1") == []

    def test_a_follow_up_that_cannot_be_written_undoes_the_completion(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a claimed job
        q = leaseq_store.queue()
        job = given_claimed(q)
        # When it completes with a follow-up that is written, then one that fails
        then = [FollowUp(q.name, [q.spec("next-1", {})]), FollowUp("other", _Unwritable())]
        with pytest.raises(FollowUpFailed):
            leaseq_store.store.complete(q.name, job.lease, '{"r": 1}', "done", None, then)
        # Then neither the completion nor the first follow-up happened
        after = must_get(q, job.id)
        assert (after.status, after.result) == ("processing", None)
        assert "result_saved" not in events(q.journal(job.id))
        assert q.get("next-1") is None and q.journal("next-1") == []
        # And the worker still holds its lease and can finish
        assert q.complete(job, {"r": 2}).status == "done"
