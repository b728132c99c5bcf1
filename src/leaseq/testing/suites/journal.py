"""The journal: a job's events in order, from the store's clock, never holding the payload."""

from __future__ import annotations

import json

from leaseq.browse import BulkAction
from leaseq.testing.harness import (
    W1,
    W2,
    FreshStore,
    advance,
    advance_past,
    events,
    given_claimed,
    given_stolen,
    leases,
    must_get,
)

#: Put in payloads; must never show up in a journal entry.
CANARY = "canary-7f3a9c-do-not-journal"


class JournalSuite:
    def test_events_of_a_jobs_life_in_order(self, leaseq_store: FreshStore) -> None:
        # Given a job that is retried once and then completes
        q = leaseq_store.queue()
        q.enqueue("j1", {"a": 1})
        (first,) = q.claim(W1)
        q.retry_later(first, "transient", delay_s=0)
        (second,) = q.claim(W2)
        q.complete(second, {"ok": True})
        # Then its journal tells that story, oldest first
        journal = q.journal("j1")
        assert events(journal) == [
            "enqueued", "claimed", "retry_scheduled", "claimed", "result_saved"]
        claims = [e for e in journal if e.event == "claimed"]
        assert [(e.attempt, e.lease_epoch, e.worker_id) for e in claims] == [
            (1, 1, W1), (2, 2, W2)]
        assert claims[0].reason != "redelivered"
        assert claims[1].reason == "redelivered"
        assert all(e.job_id == "j1" for e in journal)
        assert [e.at for e in journal] == sorted(e.at for e in journal)

    def test_a_job_deleted_and_enqueued_again_tells_both_lives_in_order(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a job that ran, was deleted, and was enqueued again under its id, twice
        store = leaseq_store.store
        q = leaseq_store.queue()
        for n in range(3):
            q.enqueue("j1", {"life": n})
            q.complete(q.claim(W1)[0])
            if n < 2:
                advance(store, 1)
                assert store.act_on_jobs("jobs", BulkAction.DELETE, ["j1"], "ops").acted == ["j1"]
                advance(store, 1)
        # Then its journal tells each life, each creation first, after the last one's deletion
        life = ["enqueued", "claimed", "result_saved"]
        journal = q.journal("j1")
        assert events(journal) == [*life, "deleted", *life, "deleted", *life]
        assert [e.at for e in journal] == sorted(e.at for e in journal)

    def test_every_claim_after_the_first_is_redelivered_refunds_included(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a job claimed and snoozed (the attempt refunded), then claimed again
        q = leaseq_store.queue()
        q.enqueue("j1", {})
        q.snooze(q.claim(W1)[0], 0)
        (job,) = q.claim(W1)
        # Then the second claim says redelivered, though attempts are still 1
        claims = [e for e in q.journal("j1") if e.event == "claimed"]
        assert [(e.attempt, e.reason) for e in claims] == [(1, None), (1, "redelivered")]
        # And so does the claim after a free give-back
        q.give_back(job, started=False)
        q.claim(W2)
        last = q.journal("j1")[-1]
        assert (last.event, last.attempt, last.reason) == ("claimed", 1, "redelivered")

    def test_journal_time_is_the_stores_clock(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        advance(leaseq_store.store, 7200)  # a clock only the store knows about
        before = leaseq_store.store.server_now()
        q.enqueue("j1", {})
        after = leaseq_store.store.server_now()
        (entry,) = q.journal("j1")
        assert before <= entry.at <= after

    def test_journal_never_holds_the_payload(self, leaseq_store: FreshStore) -> None:
        # Given a job whose payload (every revision of it) carries a canary, driven through
        # every path that writes an event
        q = leaseq_store.queue()
        q.enqueue("j1", {"secret": CANARY}, revision="r1")
        (job,) = q.claim(W1)
        q.enqueue("j1", {"secret": CANARY, "v": 2}, revision="r2")  # stale while processing
        q.complete(job, {"echo": "fine"})  # becomes a give-back
        q.mark_published(leases(q, "j1"))
        (job,) = q.claim(W1, lease_s=60)
        q.heartbeat([job])
        q.retry_later(job, "transient", delay_s=0)
        (job,) = q.claim(W1, lease_s=60)
        advance_past(leaseq_store.store, job.lease_until)
        q.reclaim_expired()
        (job,) = q.claim(W1)
        q.fail(job, "bad input")
        q.requeue("j1")
        q.cancel("j1")
        q.enqueue("j1", {"secret": CANARY, "v": 3}, revision="r3")
        # Then no entry shows it
        journal = q.journal("j1")
        assert len(journal) >= 14
        for entry in journal:
            assert CANARY not in json.dumps(entry.to_dict())

    def test_lost_heartbeat_is_journaled(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        old, _ = given_stolen(q)
        q.heartbeat([old])
        lost = [e for e in q.journal(old.id) if e.event == "heartbeat_lost"]
        assert len(lost) == 1 and lost[0].lease_epoch == old.lease_epoch

    def test_a_lost_lease_is_journaled_once_however_often_it_beats(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a lease taken over, When it beats three times (a write retried, a caller that
        # beats again)
        q = leaseq_store.queue()
        old, _ = given_stolen(q)
        for _ in range(3):
            assert q.heartbeat([old]) == [old.id]
        # Then its loss is one journal entry, as every store tells it
        lost = [e for e in q.journal(old.id) if e.event == "heartbeat_lost"]
        assert [e.lease_epoch for e in lost] == [old.lease_epoch]

    def test_a_lost_lease_and_an_expired_one_are_told_in_the_same_words_by_every_store(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a job whose lease was taken over, and a job whose last attempt's lease runs out
        q = leaseq_store.queue(max_attempts=2)
        old, _ = given_stolen(q)
        spent = given_claimed(q, "spent", lease_s=60, max_attempts=1)
        # When the old lease beats and the sweeper reclaims
        q.heartbeat([old])
        advance_past(leaseq_store.store, spent.lease_until)
        assert q.reclaim_expired() == (1, 0)
        # Then the words are leaseq.journal's LEASE_LOST and LEASE_EXPIRED_ON + HELD_BY
        lost = [e.reason for e in q.journal(old.id) if e.event == "heartbeat_lost"]
        assert lost == ["lease epoch 1 lost; job is processing at epoch 2"]
        assert must_get(q, "spent").error == f"lease expired on attempt 1 of 1 (worker {W1})"

    def test_record_appends_an_event(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        q.enqueue("j1", {})
        leaseq_store.store.append_journal(q.name, "j1", "received", attempt=1, reason="delivery 1",
                                  data={"delivery_tag": 7})
        last = q.journal("j1")[-1]
        assert (last.event, last.attempt, last.reason, dict(last.data or {})) == (
            "received", 1, "delivery 1", {"delivery_tag": 7})

    def test_journal_of_unknown_job_is_empty(self, leaseq_store: FreshStore) -> None:
        assert leaseq_store.queue().journal("nobody") == []
