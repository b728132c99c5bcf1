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


def test_a_batch_refused_as_the_worker_shuts_down_is_still_written(app: leaseq.App) -> None:
    # Given a store whose first batch completion waits, then fails as if the database were away
    store = app.store
    entered, release = threading.Event(), threading.Event()
    calls: list[int] = []
    batch_write = store.complete_many

    def late_failure(queue, items):  # type: ignore[no-untyped-def]
        calls.append(len(items))
        if len(calls) == 1:
            entered.set()
            release.wait(10)
            raise leaseq.StoreUnavailable("database restarting")
        return batch_write(queue, items)

    store.complete_many = late_failure  # type: ignore[method-assign]

    @app.task(queue="work")
    def quick() -> str:
        return "ok"

    quick.enqueue(job_id="q")
    worker = Worker(app, WorkerConfig(grace_s=0.1))
    stop_loop = worker._loop.stop

    def stop_loop_then_fail_the_batch() -> None:  # the shutdown is past its thread pools
        stop_loop()
        release.set()

    worker._loop.stop = stop_loop_then_fail_the_batch  # type: ignore[method-assign]
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    # When the worker stops while the batch holding the job's completion is being written
    assert entered.wait(10), "the batch write started"
    worker.request_stop()
    thread.join(30)
    assert not thread.is_alive()
    # Then the refused completion was written again before the worker returned: the job is
    # done, not left processing for its lease to run out
    job = app.queue("work").get("q")
    assert job is not None and (job.status, job.result) == ("done", "ok")
    assert calls == [1]  # the second write was the job's own, not a batch
