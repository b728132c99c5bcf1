"""The operators' tools (DESIGN.md §8): the filtered job page, bulk actions on a counted
snapshot, journal counts per hour and the worker registry that the dashboard and ``leaseq
doctor`` read."""

from __future__ import annotations

from datetime import timedelta

import pytest

from leaseq.browse import BulkAction, Count, JobFilter
from leaseq.errors import JobNotFound
from leaseq.queue import Queue
from leaseq.testing.harness import (
    W1,
    W2,
    FreshStore,
    advance,
    events,
    given_jobs,
    must_get,
    within_readings,
)


def given_failed(q: Queue, job_id: str, error: str = "boom", task: str | None = None) -> None:
    q.enqueue(job_id, {"name": job_id}, task=task)
    job = q.claim_one(job_id, W1, lease_s=600)
    assert job is not None
    q.fail(job, error)


def page_ids(store, where: JobFilter, limit: int = 50) -> list[str]:
    """Every matching id, page after page."""
    ids: list[str] = []
    cursor = None
    while True:
        page = store.find_jobs(where, limit=limit, cursor=cursor)
        ids.extend(job.id for job in page.jobs)
        if page.next_cursor is None:
            return ids
        cursor = page.next_cursor


class OperatorToolsSuite:
    def test_pages_walk_every_job_once_in_id_order(self, leaseq_store: FreshStore) -> None:
        # Given 23 jobs
        q = leaseq_store.queue()
        ids = given_jobs(q, 23)
        # When they are read 5 at a time
        got = page_ids(leaseq_store.store, JobFilter("jobs"), limit=5)
        # Then every job comes once, in id order
        assert got == ids
        assert leaseq_store.store.find_jobs(JobFilter("other")).jobs == []

    def test_filter_by_status_is_newest_first(self, leaseq_store: FreshStore) -> None:
        # Given three failed jobs, failed one after another, and a pending one
        q = leaseq_store.queue()
        for job_id in ("f1", "f2", "f3"):
            given_failed(q, job_id)
            advance(leaseq_store.store, 1)
        q.enqueue("p1", {})
        # When the failed ones are read two at a time
        got = page_ids(leaseq_store.store, JobFilter("jobs", status="failed"), limit=2)
        # Then the last to fail comes first, and the pending job is not among them
        assert got == ["f3", "f2", "f1"]

    def test_filters_by_task_prefix_error_and_time(self, leaseq_store: FreshStore) -> None:
        # Given failed jobs of two tasks and errors, and pending ones
        store = leaseq_store.store
        q = leaseq_store.queue()
        given_failed(q, "a-1", "Timeout talking to S3", task="export")
        given_failed(q, "a-2", "bad row 7", task="export")
        given_failed(q, "b-1", "timeout again", task="mail")
        q.enqueue("a-3", {}, task="export")
        later = store.server_now() + timedelta(seconds=5)
        advance(store, 10)
        given_failed(q, "b-2", "late timeout", task="mail")
        # Then each filter keeps only its jobs, alone or together
        assert page_ids(store, JobFilter("jobs", task="export")) == ["a-1", "a-2", "a-3"]
        assert page_ids(store, JobFilter("jobs", id_prefix="a-")) == ["a-1", "a-2", "a-3"]
        assert page_ids(store, JobFilter("jobs", error_text="TIMEOUT")) == ["a-1", "b-1", "b-2"]
        assert page_ids(store, JobFilter("jobs", status="failed", task="mail",
                                         error_text="timeout")) == ["b-2", "b-1"]
        assert page_ids(store, JobFilter("jobs", status="failed", updated_from=later)) == ["b-2"]
        assert page_ids(store, JobFilter("jobs", task="mail", updated_until=later)) == ["b-1"]
        assert page_ids(store, JobFilter("jobs", id_prefix="b-", error_text="late")) == ["b-2"]

    def test_bulk_acts_only_on_the_counted_snapshot(self, leaseq_store: FreshStore) -> None:
        # Given three pending jobs counted for a bulk cancel
        store = leaseq_store.store
        q = leaseq_store.queue()
        given_jobs(q, 3)
        snapshot = store.snapshot_ids(JobFilter("jobs", status="pending"))
        assert len(snapshot) == 3
        # And a job that starts to match after the count, and one counted that finished since
        q.enqueue("late", {})
        (claimed,) = q.claim(W2, limit=1)
        q.complete(claimed, None)
        # When the bulk cancel runs on the snapshot
        result = store.act_on_jobs("jobs", BulkAction.CANCEL, snapshot, actor="alice")
        # Then only the counted jobs whose state still fits were cancelled
        assert sorted(result.acted) == sorted(set(snapshot) - {claimed.id})
        assert result.skipped == [claimed.id]
        assert must_get(q, "late").status == "pending"
        assert must_get(q, claimed.id).status == "done"
        last = q.journal(result.acted[0])[-1]
        assert (last.event, last.reason) == ("cancelled", "by alice")

    def test_bulk_requeue_and_delete_fit_terminal_jobs_only(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a failed job and a pending one
        store = leaseq_store.store
        q = leaseq_store.queue()
        given_failed(q, "f1")
        q.enqueue("p1", {})
        # When both are requeued, then both deleted
        requeued = store.act_on_jobs("jobs", BulkAction.REQUEUE, ["f1", "p1", "gone"], "bob")
        # Then only the failed one was requeued, ready with a fresh budget
        assert (requeued.acted, requeued.skipped) == (["f1"], ["p1", "gone"])
        job = must_get(q, "f1")
        assert (job.status, job.attempts, job.failure) == ("pending", 0, None)
        assert q.journal("f1")[-1].event == "requeued"
        # And delete takes no live job
        again = q.claim_one("f1", W1, lease_s=600)
        assert again is not None
        q.fail(again, "again")
        deleted = store.act_on_jobs("jobs", BulkAction.DELETE, ["f1", "p1"], "bob")
        assert (deleted.acted, deleted.skipped) == (["f1"], ["p1"])
        assert q.get("f1") is None and q.get("p1") is not None

    def test_bulk_results_list_the_ids_in_the_order_given(self, leaseq_store: FreshStore) -> None:
        # Given failed, cancelled and pending jobs, whose ids do not sort as they are given
        store = leaseq_store.store
        q = leaseq_store.queue()
        for job_id in ("f-b", "f-a"):
            given_failed(q, job_id)
        q.enqueue("c-z", {})
        assert q.cancel("c-z")
        q.enqueue("p-y", {})
        # When an action is given them in an order of the operator's, a repeat and an unknown
        given = ["f-b", "p-y", "c-z", "gone", "f-a", "f-b"]
        result = store.act_on_jobs("jobs", BulkAction.REQUEUE, given, "bob")
        # Then both lists keep that order, once each, whatever the statements returned
        assert (result.acted, result.skipped) == (["f-b", "c-z", "f-a"], ["p-y", "gone"])

    def test_bulk_runs_in_batches_over_many_jobs(self, leaseq_store: FreshStore) -> None:
        # Given more pending jobs than one batch holds
        store = leaseq_store.store
        ids = given_jobs(leaseq_store.queue(), 1203)
        # When all are cancelled in one call
        result = store.act_on_jobs("jobs", BulkAction.CANCEL, ids, "carol")
        # Then every one was cancelled
        assert sorted(result.acted) == ids and result.skipped == []
        assert store.counts("jobs") == {"cancelled": 1203}

    def test_requeue_edited_replaces_the_payload(self, leaseq_store: FreshStore) -> None:
        # Given a failed job
        store = leaseq_store.store
        q = leaseq_store.queue()
        given_failed(q, "f1")
        q.enqueue("p1", {})
        # When an operator fixes its payload and requeues it
        assert store.requeue_edited("jobs", "f1", '{"fixed":true}', "dana") is True
        # Then it is ready with the new payload, and the journal names the operator only
        job = must_get(q, "f1")
        assert (job.status, job.payload, job.attempts) == ("pending", {"fixed": True}, 0)
        tail = q.journal("f1")[-2:]
        assert [(e.event, e.reason) for e in tail] == [("edited", "by dana"),
                                                       ("requeued", "by dana")]
        assert "fixed" not in str([e.data for e in tail])
        # And a live job is refused, an unknown one raises
        assert store.requeue_edited("jobs", "p1", "{}", "dana") is False
        with pytest.raises(JobNotFound):
            store.requeue_edited("jobs", "nope", "{}", "dana")

    def test_journal_counts_per_hour(self, leaseq_store: FreshStore) -> None:
        # Given one job quarantined, then two hours later two more and two jobs only enqueued
        store = leaseq_store.store
        q = leaseq_store.queue()
        given_failed(q, "f0")
        advance(store, 7200)
        given_jobs(q, 2)
        given_failed(q, "f1")
        given_failed(q, "f2")
        # When the last hour is counted
        recent = store.journal_hourly("jobs", hours=1)
        # Then it holds the recent quarantines, each counted once; enqueues and claims are not
        # counted (HOURLY_UNCOUNTED)
        assert [(c.event, c.count) for c in recent] == [("quarantined", 2)]
        assert recent[0].hour <= store.server_now()
        # And four hours back sees the first one too, in an older hour first
        wide = store.journal_hourly("jobs", hours=4)
        assert [(c.event, c.count) for c in wide] == [("quarantined", 1), ("quarantined", 2)]
        assert wide[0].hour < wide[1].hour == recent[0].hour
        assert store.journal_hourly("other", hours=4) == []

    def test_journal_counts_a_window_that_ends_now(self, leaseq_store: FreshStore) -> None:
        # Given a job quarantined and one done, 40 minutes later another quarantined, and
        # 30 minutes after that a third: the first two 70 minutes old, wherever the clock
        # hour's edge fell
        store = leaseq_store.store
        q = leaseq_store.queue()
        given_failed(q, "f0")
        q.enqueue("d0", {})
        done = q.claim_one("d0", W1, lease_s=600)
        assert done is not None
        q.complete(done)
        advance(store, 2400)
        given_failed(q, "f1")
        advance(store, 1800)
        given_failed(q, "f2")
        # When the last hour is counted, Then it holds the two recent quarantines only; the
        # enqueues and claims are not counted (HOURLY_UNCOUNTED)
        assert store.journal_counts("jobs", 3600) == {"quarantined": 2}
        # And a wider window counts the first two as well
        assert store.journal_counts("jobs", 5400) == {"quarantined": 3, "result_saved": 1}
        assert store.journal_counts("other", 3600) == {}

    def test_worker_registry_keeps_pruned_and_forgotten(self, leaseq_store: FreshStore) -> None:
        store = leaseq_store.store
        # Given two workers that beat
        store.register_worker(W1, ["jobs"], 0)
        store.register_worker(W2, ["jobs", "mail"], 2)
        first = {w.worker_id: w for w in store.list_workers()}
        assert list(first) == sorted([W1, W2])
        assert (first[W2].queues, first[W2].in_flight) == (["jobs", "mail"], 2)
        # When W1 beats again later and W2 stops beating
        advance(store, 120)
        store.register_worker(W1, ["jobs"], 3)
        # Then W1 keeps its start and moves its beat; pruning forgets only W2
        again = {w.worker_id: w for w in store.list_workers()}
        assert again[W1].started_at == first[W1].started_at
        assert again[W1].last_beat_at > first[W1].last_beat_at
        assert again[W1].in_flight == 3
        assert store.prune_workers(60) == 1
        assert [w.worker_id for w in store.list_workers()] == [W1]
        # And a clean stop forgets W1
        store.unregister_worker(W1)
        store.unregister_worker(W1)
        assert store.list_workers() == []
        assert store.prune_workers(60) == 0

    def test_snapshot_refuses_more_than_its_limit(self, leaseq_store: FreshStore) -> None:
        from leaseq.errors import InvalidInput

        given_jobs(leaseq_store.queue(), 5)
        with pytest.raises(InvalidInput):
            leaseq_store.store.snapshot_ids(JobFilter("jobs"), limit=4)
        assert events(leaseq_store.queue().journal("job-00000")) == ["enqueued"]

    def test_queue_summary_counts_up_to_its_cap(self, leaseq_store: FreshStore) -> None:
        # Given 7 ready jobs, one claimed, one failed
        store = leaseq_store.store
        q = leaseq_store.queue()
        start = store.server_now()
        given_jobs(q, 7)
        q.claim(W2, limit=1)
        given_failed(q, "f1")
        advance(store, 30)
        # When it is summarised exactly, then with a cap of 5
        exact = store.queue_summary("jobs")
        capped = store.queue_summary("jobs", cap=5)
        # Then the exact counts are exact and the capped ones say they stopped
        assert {s: c.n for s, c in exact.counts.items()} == {
            "pending": 6, "processing": 1, "done": 0, "failed": 1, "cancelled": 0}
        assert all(c.exact for c in exact.counts.values()) and exact.ready.n == 6
        # (the oldest ready job waited the 30 s and however long the calls since took; whole
        # seconds either way)
        upto = (store.server_now() - start).total_seconds()
        oldest = exact.oldest_ready_s
        assert within_readings(29, upto + 1, shortest=oldest, longest=oldest), (oldest, upto)
        pending = capped.counts["pending"]
        assert not pending.exact and pending.n >= 5
        assert capped.counts["failed"].n == 1 and capped.counts["failed"].exact
        assert (capped.ready.n, capped.ready.exact) == (5, False)
        empty = store.queue_summary("other")
        assert (empty.ready.n, empty.oldest_ready_s) == (0, 0.0)
        assert sum(c.n for c in empty.counts.values()) == 0
        assert exact.lapsed.n == empty.lapsed.n == 0

    def test_queue_summary_counts_the_leases_that_ran_out(self, leaseq_store: FreshStore) -> None:
        # Given three claimed jobs: two under a lease of 10 s, one of an hour
        store = leaseq_store.store
        q = leaseq_store.queue()
        given_jobs(q, 3)
        assert len(q.claim(W1, limit=2, lease_s=10)) == 2
        assert len(q.claim(W2, limit=1, lease_s=3600)) == 1
        # When 30 s pass, Then the two short leases have run out, and a cap stops the count
        advance(store, 30)
        assert store.queue_summary("jobs").lapsed == Count(2)
        assert store.queue_summary("jobs", cap=1).lapsed == Count(1, exact=False)
        # And a sweep's reclaim leaves none
        q.reclaim_expired()
        assert store.queue_summary("jobs").lapsed == Count(0)
