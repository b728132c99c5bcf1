"""The outbox owes a publish again when a message was dead-lettered unsettled
(``reowe_publish``): the broker's delivery limit is not a verdict on the job."""

from __future__ import annotations

from leaseq.testing.harness import W1, FreshStore, events, given_claimed, leases, must_get


class OutboxReoweSuite:
    def test_reowe_publish_owes_again_only_pending_jobs_with_a_publish_marked(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a published pending job (its message dead-lettered), one never published,
        # one published then claimed, and one done
        q = leaseq_store.queue()
        for job_id in ("lost", "owed", "taken"):
            q.enqueue(job_id, {})
        assert q.mark_published(leases(q, "lost", "taken")) == 2
        q.claim_one("taken", W1)
        q.complete(given_claimed(q, "finished"))
        # When the dispatcher re-owes the publish of each, and of an id that does not exist
        store = leaseq_store.store
        changed = store.reowe_publish(q.name, ["lost", "owed", "taken", "finished", "missing"])
        # Then only the published pending job is owed again, and its journal says why
        assert changed == ["lost"]
        assert [j.id for j in q.outbox_due()] == ["lost", "owed"]
        assert must_get(q, "taken").status == "processing"
        assert must_get(q, "finished").status == "done"
        entry = q.journal("lost")[-1]
        assert (entry.event, entry.reason) == ("publish_owed", store.REOWE_REASON)
        assert "publish_owed" not in events(q.journal("owed") + q.journal("taken"))

    def test_reowe_publish_twice_owes_one_publish(self, leaseq_store: FreshStore) -> None:
        # Given a job re-owed once
        q = leaseq_store.queue()
        q.enqueue("j1", {})
        assert q.mark_published(leases(q, "j1")) == 1
        assert q.store.reowe_publish(q.name, ["j1"], reason="dead-lettered") == ["j1"]
        # When the same dead letter is read again (its ack was lost), or nothing is given
        again = q.store.reowe_publish(q.name, ["j1"])
        # Then nothing changes and one event stands in the journal, with the given reason
        assert again == [] and q.store.reowe_publish(q.name, []) == []
        owed = [e for e in q.journal("j1") if e.event == "publish_owed"]
        assert [e.reason for e in owed] == ["dead-lettered"]
        # and the next publish marks it as any other
        assert q.mark_published(leases(q, "j1")) == 1
        assert must_get(q, "j1").published_at is not None
