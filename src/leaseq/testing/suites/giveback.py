"""Give-back: a job handed back without an outcome (a worker stopping), ready at once; free
when its handler never started, free a bounded number of times when it ran, never a snooze."""

from __future__ import annotations

import pytest

from leaseq.job import LeaseLost
from leaseq.testing.harness import (
    CLOCK_SLACK_S,
    W1,
    W2,
    FreshStore,
    events,
    given_claimed,
    given_stolen,
    must_get,
    seconds_until,
)

REASON = "worker shutting down"


class GiveBackSuite:
    def test_a_handler_that_never_started_is_given_back_free(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a queue that allows no counted give-back at all
        q = leaseq_store.queue(max_attempts=1, max_givebacks=0)
        q.enqueue("j1", {})
        # When the job is claimed and given back unstarted again and again
        for _ in range(5):
            back = q.give_back(q.claim(W1)[0], started=False, reason=REASON)
            # Then it costs nothing and is ready at once
            assert (back.status, back.attempts, back.givebacks, back.snoozes) == (
                "pending", 0, 0, 0)
            ready_in = seconds_until(leaseq_store.store, back.lease_until)
            assert ready_in <= CLOCK_SLACK_S
        last = q.journal("j1")[-1]
        assert (last.event, last.reason) == ("given_back", REASON)

    def test_a_running_handler_is_given_back_free_up_to_the_bound(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a queue that refunds two give-backs of a running handler
        q = leaseq_store.queue(max_attempts=3, max_givebacks=2)
        q.enqueue("j1", {})
        # When the job is given back while running, twice
        for n in (1, 2):
            back = q.give_back(q.claim(W1)[0], started=True, reason=REASON)
            # Then each is counted and refunded
            assert (back.status, back.attempts, back.givebacks) == ("pending", 0, n)
        # When it is given back a third time, Then the attempt is spent, still ready at once
        back = q.give_back(q.claim(W1)[0], started=True, reason=REASON)
        assert (back.status, back.attempts, back.givebacks) == ("pending", 1, 2)
        assert q.ready() == 1
        (again,) = q.claim(W2)
        assert again.attempts == 2

    def test_past_the_bound_on_the_last_attempt_it_fails_exhausted(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a job whose give-backs are never free, with two attempts
        q = leaseq_store.queue(max_attempts=2, max_givebacks=0)
        q.enqueue("j1", {})
        assert q.give_back(q.claim(W1)[0], started=True, reason=REASON).attempts == 1
        # When it is given back while running on its last attempt
        done = q.give_back(q.claim(W1)[0], started=True, reason=REASON)
        # Then it ends, quarantined with a reason that says why
        assert (done.status, done.failure, done.attempts) == ("failed", "exhausted", 2)
        assert "given back" in (done.error or "")
        last = q.journal("j1")[-1]
        assert last.event == "quarantined" and "given back" in (last.reason or "")
        assert q.claim(W1) == [] and must_get(q, "j1") == done

    def test_a_give_back_is_not_a_snooze(self, leaseq_store: FreshStore) -> None:
        # Given a queue that allows no snooze
        q = leaseq_store.queue(max_snoozes=0)
        q.enqueue("j1", {})
        # When the job is given back, Then the snooze bound is not touched
        for started in (False, True, False):
            back = q.give_back(q.claim(W1)[0], started=started, reason=REASON)
            assert (back.status, back.snoozes) == ("pending", 0)
        assert "snoozed" not in events(q.journal("j1"))

    def test_give_back_is_fenced(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        old, new = given_stolen(q)
        with pytest.raises(LeaseLost):
            q.give_back(old, started=True, reason=REASON)
        assert must_get(q, old.id) == must_get(q, new.id)
        assert must_get(q, old.id).lease_epoch == new.lease_epoch
        assert events(q.journal(old.id))[-1] == "claimed"

    def test_started_must_be_a_bool(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        job = given_claimed(q)
        with pytest.raises(ValueError):
            q.give_back(job, started="yes", reason=REASON)  # type: ignore[arg-type]  # the point
        assert must_get(q, job.id).status == "processing"
