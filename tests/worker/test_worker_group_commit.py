"""Completions go to the group commit: the handler's slot is free at once, the job stays in
flight (under lease) until its batch committed, and a batch the store refused is written again
on its own."""

from __future__ import annotations

import threading

from worker_helpers import running, wait_until

import leaseq
from leaseq.worker import Worker, WorkerConfig


def test_a_batch_the_store_refused_is_written_again_job_by_job(app: leaseq.App) -> None:
    # Given a store whose first batch completion fails as if the database were away
    store = app.store
    failed: list[int] = []
    batch_write = store.complete_many

    def flaky_complete_many(queue, items):  # type: ignore[no-untyped-def]
        if not failed:
            failed.append(len(items))
            raise leaseq.StoreUnavailable("database restarting")
        return batch_write(queue, items)

    store.complete_many = flaky_complete_many  # type: ignore[method-assign]

    @app.task(queue="work")
    def double(n: int) -> int:
        return n * 2

    for n in range(6):
        double.enqueue(n=n, job_id=f"j{n}")
    # When a burst worker runs them
    Worker(app, WorkerConfig(burst=True, concurrency=3)).run()
    # Then the refused batch was written again and every job is done with its result, once
    q = app.queue("work")
    assert failed
    assert [q.get(f"j{n}").result for n in range(6)] == [0, 2, 4, 6, 8, 10]  # type: ignore[union-attr]
    assert all(q.get(f"j{n}").attempts == 1 for n in range(6))  # type: ignore[union-attr]


def test_a_job_is_in_flight_until_its_batch_committed(app: leaseq.App) -> None:
    # Given a store whose batch completion waits on a gate
    store = app.store
    gate = threading.Event()
    entered = threading.Event()
    batch_write = store.complete_many

    def held_complete_many(queue, items):  # type: ignore[no-untyped-def]
        entered.set()
        gate.wait(30)
        return batch_write(queue, items)

    store.complete_many = held_complete_many  # type: ignore[method-assign]

    @app.task(queue="work")
    def quick() -> str:
        return "ok"

    quick.enqueue(job_id="j")
    q = app.queue("work")
    with running(app, concurrency=2) as worker:
        # When its handler returned and the completion is being written
        assert entered.wait(15)
        # Then the job is still this worker's, processing, and not beaten by the heartbeat
        assert [j.id for j in worker.in_flight()] == ["j"]
        assert q.get("j").status == "processing"  # type: ignore[union-attr]
        # And once the batch commits it is done and leaves the worker
        gate.set()
        wait_until(lambda: q.is_finished("j") and not worker.in_flight(), what="j settled")
    assert q.get("j").status == "done"  # type: ignore[union-attr]
