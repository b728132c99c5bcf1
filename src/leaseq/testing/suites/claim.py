"""Claim: what is claimable, what a claim writes, and that concurrent claims never share a job."""

from __future__ import annotations

import multiprocessing
import threading
from collections import Counter
from typing import Any

from leaseq.stores import connect
from leaseq.testing.harness import (
    LONG_LEASE_S,
    W1,
    W2,
    FreshStore,
    advance,
    given_jobs,
    must_get,
    run_processes,
    within_readings,
)

RACE_JOBS = 1000


def _claim_until_empty(q: Any, worker_id: str, limit: int) -> list[str]:
    taken: list[str] = []
    while jobs := q.claim(worker_id, limit=limit, lease_s=LONG_LEASE_S):
        taken.extend(job.id for job in jobs)
    return taken


def _claiming_process(url: str, options: dict[str, Any], queue: str, barrier: Any,
                      worker_id: str, limit: int) -> list[str]:
    """One worker process: open the store from its URL, wait for the others, claim all."""
    store = connect(url, **options)
    try:
        q = store.queue(queue)
        barrier.wait(timeout=60)
        return _claim_until_empty(q, worker_id, limit)
    finally:
        store.close()


def assert_each_claimed_once(q: Any, ids: list[str], taken: list[str]) -> None:
    twice = [job_id for job_id, n in Counter(taken).items() if n > 1]
    assert not twice, f"jobs in two claims' results: {twice[:10]}"
    assert sorted(taken) == sorted(ids)
    # One claim each: the lease taken was never lost to a second claim.
    assert q.counts() == {"processing": len(ids)}
    for job_id in ids[:: max(len(ids) // 50, 1)]:
        job = must_get(q, job_id)
        assert (job.attempts, job.lease_epoch) == (1, 1)


class ClaimSuite:
    def test_claim_on_empty_queue_returns_nothing(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        assert q.claim(W1, limit=10) == []

    def test_claim_takes_job_and_sets_lease_from_store_clock(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a ready job
        q = leaseq_store.queue(lease_s=120)
        q.enqueue("j1", {"a": 1})
        # When it is claimed
        before = leaseq_store.store.server_now()
        (job,) = q.claim(W1)
        after = leaseq_store.store.server_now()
        # Then it is processing for W1; attempts and epoch are counted at claim
        assert (job.id, job.status, job.worker_id) == ("j1", "processing", W1)
        assert (job.attempts, job.lease_epoch) == (1, 1)
        assert job.lease_until is not None
        lease_from = (job.lease_until - before).total_seconds()
        lease_to = (job.lease_until - after).total_seconds()
        assert within_readings(120, 120, shortest=lease_to, longest=lease_from), (
            lease_to, lease_from)
        assert must_get(q, "j1") == job

    def test_claim_respects_limit_and_not_before_order(self, leaseq_store: FreshStore) -> None:
        # Given three jobs whose not-before order differs from their id order
        q = leaseq_store.queue()
        q.enqueue_many([q.spec("c", {}, delay_s=2), q.spec("a", {}, delay_s=3),
                        q.spec("b", {}, delay_s=1)])
        advance(leaseq_store.store, 10)
        # When claims take two, then the rest
        first = q.claim(W1, limit=2)
        rest = q.claim(W1, limit=2)
        # Then the earliest not-before go first
        assert sorted(j.id for j in first) == ["b", "c"]
        assert [j.id for j in rest] == ["a"]

    def test_delayed_job_is_claimable_only_when_due(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        q.enqueue("later", {}, delay_s=30)
        assert q.claim(W1) == []
        advance(leaseq_store.store, 25)  # 5 s short: the test's own time passes on the clock too
        assert q.claim(W1) == []
        advance(leaseq_store.store, 6)
        assert [j.id for j in q.claim(W1)] == ["later"]

    def test_held_lease_is_not_claimable(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        q.enqueue("j1", {})
        q.claim(W1, lease_s=60)
        advance(leaseq_store.store, 55)  # 5 s short, as above
        assert q.claim(W2) == []

    def test_claim_one_takes_only_a_ready_job(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        q.enqueue("now", {})
        q.enqueue("later", {}, delay_s=60)
        assert q.claim_one("later", W1) is None
        assert q.claim_one("missing", W1) is None
        job = q.claim_one("now", W1)
        assert job is not None and (job.status, job.attempts) == ("processing", 1)
        # A second delivery of the same job while its lease is held takes nothing.
        assert q.claim_one("now", W2) is None
        assert must_get(q, "now").worker_id == W1

    def test_claim_never_takes_another_queues_jobs(self, leaseq_store: FreshStore) -> None:
        mine, other = leaseq_store.queue("mine"), leaseq_store.queue("other")
        other.enqueue("j1", {})
        assert mine.claim(W1) == []
        assert mine.get("j1") is None
        # The same id may live in two queues as two jobs.
        mine.enqueue("j1", {"q": "mine"})
        assert [j.payload for j in mine.claim(W1)] == [{"q": "mine"}]
        assert other.counts() == {"pending": 1}

    def test_1000_jobs_claimed_by_8_threads_each_exactly_once(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given 1,000 ready jobs
        q = leaseq_store.queue()
        ids = given_jobs(q, RACE_JOBS)
        start = threading.Barrier(8)
        taken: list[list[str]] = [[] for _ in range(8)]

        def worker(i: int) -> None:
            start.wait(timeout=30)
            taken[i] = _claim_until_empty(q, f"host:{i}:thread{i:02d}", limit=i + 1)

        # When 8 threads claim at once, with different batch sizes
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        # Then every job is in exactly one claim's result
        assert_each_claimed_once(q, ids, [job_id for part in taken for job_id in part])
        assert sum(1 for part in taken if part) > 1, "the race never happened"

    def test_1000_jobs_claimed_by_4_processes_each_exactly_once(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given 1,000 ready jobs, and 4 processes that open the store from its URL
        q = leaseq_store.queue()
        ids = given_jobs(q, RACE_JOBS)
        barrier = _spawn_barrier(4)
        args = [(leaseq_store.url, dict(leaseq_store.options), q.name, barrier,
                 f"host:{i}:proc{i:04d}", 3 + i) for i in range(4)]
        # When they claim at once
        taken = run_processes(_claiming_process, args, timeout_s=120)
        # Then every job is in exactly one claim's result
        assert_each_claimed_once(q, ids, [job_id for part in taken for job_id in part])


def _spawn_barrier(parties: int) -> Any:
    return multiprocessing.get_context("spawn").Barrier(parties)
