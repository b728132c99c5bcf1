"""``Queue.iter_jobs``: every job of a queue, a page at a time."""

from __future__ import annotations

import pytest

import leaseq


def test_walks_every_job_once_in_id_order_across_pages(store: leaseq.Store) -> None:
    # Given 23 jobs, one of them failed, and a job in another queue
    q = store.queue("images")
    for i in range(23):
        q.enqueue(f"j{i:02d}", {})
    (job,) = q.claim("w", 1)
    q.fail(job, "corrupt", "permanent")
    store.queue("other").enqueue("elsewhere", {})
    # When the queue is walked 5 at a time
    ids = [j.id for j in q.iter_jobs(page_size=5)]
    # Then each of its jobs comes once, in id order, and a status narrows the walk
    assert ids == [f"j{i:02d}" for i in range(23)]
    assert [j.id for j in q.iter_jobs("failed", page_size=5)] == [job.id]
    assert list(store.queue("empty").iter_jobs()) == []


def test_a_page_size_below_one_is_refused(store: leaseq.Store) -> None:
    with pytest.raises(leaseq.InvalidInput, match="page_size"):
        next(store.queue("images").iter_jobs(page_size=0))
