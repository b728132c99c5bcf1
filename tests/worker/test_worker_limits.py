"""Limits in the claim through the high-level API and the real worker (docs/limits.md): a
task's default priority and per-call priority and key; a worker on a key-limited queue runs
no more of a key at once than the limit, whatever its slots and prefetch."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from worker_helpers import running, wait_until

import leaseq
from leaseq.errors import InvalidInput
from leaseq.worker import Worker, WorkerConfig


def test_a_tasks_priority_is_its_jobs_default_and_a_call_may_override_it(
        app: leaseq.App) -> None:
    # Given a task with priority 5
    @app.task(queue="work", priority=5)
    def export(n: int) -> None: ...

    # When jobs are enqueued with the default, another priority, and a key
    export.enqueue(n=1, job_id="default")
    export.enqueue(n=2, job_id="urgent", priority=20, concurrency_key="tenant:7")
    queue, spec = export.spec(n=3, job_id="later", priority=-1)
    app.enqueue_many([(queue, spec)])
    # Then each carries its own, and claims go highest first
    q = app.queue("work")
    got = {j.id: (j.priority, j.concurrency_key) for j in q.iter_jobs()}
    assert got == {"default": (5, None), "urgent": (20, "tenant:7"), "later": (-1, None)}
    assert [q.claim("w")[0].id for _ in range(3)] == ["urgent", "default", "later"]


def test_a_bad_priority_or_a_task_parameter_named_like_an_option_is_refused(
        app: leaseq.App) -> None:
    with pytest.raises(InvalidInput, match="priority"):
        app.task(queue="work", priority="high")(lambda: None)
    with pytest.raises(InvalidInput):
        @app.task(queue="work")
        def clash(priority: int) -> None: ...


def test_the_worker_runs_no_more_of_a_key_at_once_than_its_limit(url: str) -> None:
    # Given a queue with key_limit 2 and 12 jobs of one key (and 4 without a key), a worker of
    # 8 slots (and its default prefetch)
    app = leaseq.App(url, queues={"limited": {"key_limit": 2}})
    lock, running_now, peaks = threading.Lock(), {"k": 0, None: 0}, {"k": 0, None: 0}

    @app.task(queue="limited")
    def hold(key: str | None) -> None:
        with lock:
            running_now[key] += 1
            peaks[key] = max(peaks[key], running_now[key])
        time.sleep(0.02)
        with lock:
            running_now[key] -= 1

    for i in range(12):
        hold.enqueue(key="k", job_id=f"k{i}", concurrency_key="k")
    for i in range(4):
        hold.enqueue(key=None, job_id=f"u{i}")
    q = app.queue("limited")
    # When the worker drains the queue
    with running(app, concurrency=8):
        wait_until(lambda: q.counts() == {"done": 16}, what="all 16 done")
    app.store.close()
    # Then at most 2 of the key ever ran at once; the jobs without a key were not held back
    assert peaks["k"] == 2, peaks
    assert peaks[None] >= 1


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextmanager
def worker_thread(worker: Worker) -> Iterator[Worker]:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.request_stop()
        thread.join(30)
    assert not thread.is_alive(), "worker did not stop"


def _processing_by_key(q: leaseq.Queue) -> dict[str | None, int]:
    by_key: dict[str | None, int] = {}
    for job in q.iter_jobs("processing"):
        by_key[job.concurrency_key] = by_key.get(job.concurrency_key, 0) + 1
    return by_key


def gated_app(url: str, limits: dict[str, int]) -> tuple[leaseq.App, Any, threading.Event]:
    """An app whose queue "limited" has ``limits``, and a task of it that holds its slot until
    the event is set."""
    app = leaseq.App(url, queues={"limited": limits})
    gate = threading.Event()

    @app.task(queue="limited")
    def blocked() -> None:
        gate.wait(30)

    return app, blocked, gate


@dataclass
class Warmed:
    """A worker of 4 slots and a prefetch of up to 8 whose clock stands still, warmed up by 8
    quick jobs so that it has earned the whole allowance; ``blocked`` holds its slot until
    ``gate`` opens."""

    app: leaseq.App
    q: leaseq.Queue
    worker: Worker
    blocked: Any
    gate: threading.Event


@contextmanager
def warmed_worker(url: str, limits: dict[str, int]) -> Iterator[Warmed]:
    app, blocked, gate = gated_app(url, limits)

    @app.task(queue="limited")
    def quick() -> None: ...

    q = app.queue("limited")
    worker = Worker(app, WorkerConfig(concurrency=4, prefetch=8, prefetch_wait_s=60,
                                      idle_max_s=0.05), clock=ManualClock())
    try:
        with worker_thread(worker):
            app.enqueue_many([quick.spec(job_id=f"q{i}", concurrency_key=f"k{i % 4}")
                              for i in range(8)])
            wait_until(lambda: q.counts().get("done") == 8, what="the quick jobs")
            assert worker._prefetch.allowance() == 8
            try:
                yield Warmed(app, q, worker, blocked, gate)
            finally:
                gate.set()  # a failed test's worker drains at once, before its store closes
            wait_until(lambda: q.counts().get("pending", 0) + q.counts().get("processing", 0)
                       == 0, what="every job done")
    finally:
        gate.set()
        app.store.close()


def test_a_key_limited_queue_is_claimed_ahead_within_its_keys_free_slots(url: str) -> None:
    # Given the warmed-up worker on a queue with key_limit 2
    with warmed_worker(url, {"key_limit": 2}) as w:
        # When 24 jobs that hold their slot arrive, 4 of each of 6 keys
        w.app.enqueue_many([w.blocked.spec(job_id=f"b{i}", concurrency_key=f"k{i % 6}")
                            for i in range(24)])
        # Then it claims 12 (its 4 slots and 8 ahead): each key's 2 slots, no more
        wait_until(lambda: w.q.counts().get("processing") == 12, what="12 jobs claimed")
        assert _processing_by_key(w.q) == {f"k{i}": 2 for i in range(6)}
        # (once its 4 slots have started theirs: the loop takes them off the waiting list in
        # turn, so a look before then finds more than the 8 claimed ahead)
        wait_until(lambda: w.worker._running == 4, what="the 4 slots' jobs started")
        assert len(w.worker._ready) == 8


def test_a_rate_limited_queue_is_never_claimed_ahead(url: str) -> None:
    # Given the same worker on a queue with a rate limit (a prefetched job would spend its
    # claim's place in the window while it waits)
    with warmed_worker(url, {"rate_per_s": 1000}) as w:
        # When 12 jobs that hold their slot arrive
        w.app.enqueue_many([w.blocked.spec(job_id=f"b{i}") for i in range(12)])
        # Then it claims its 4 free slots only, its earned allowance unused
        wait_until(lambda: w.q.counts().get("processing") == 4, what="4 jobs claimed")
        # (all 4 started: the loop takes each claimed job from its waiting list in turn, so a
        # look before then can find the last one still there without any claimed ahead)
        wait_until(lambda: w.worker._running == 4, what="the 4 jobs started")
        w.worker._wake.set()  # another claim round: still nothing beyond the free slots
        assert w.q.counts().get("processing") == 4 and not w.worker._ready


def after_each_claim(monkeypatch: pytest.MonkeyPatch,
                     then: Callable[[list[leaseq.Job]], None]) -> None:
    """Every ``Queue.claim`` calls ``then`` with its jobs before it returns them."""
    claim = leaseq.Queue.claim

    def claim_then(self: leaseq.Queue, *args: Any, **kwargs: Any) -> list[leaseq.Job]:
        jobs = claim(self, *args, **kwargs)
        then(jobs)
        return jobs

    monkeypatch.setattr(leaseq.Queue, "claim", claim_then)


def still_worker(app: leaseq.App, monkeypatch: pytest.MonkeyPatch,
                 idle_max_s: float = 0.01) -> tuple[Worker, ManualClock, list[int]]:
    """A worker of 4 slots polling first after 10 ms, whose clock stands still; and the
    sizes of the claims it makes, in order."""
    claims: list[int] = []
    after_each_claim(monkeypatch, lambda jobs: claims.append(len(jobs)))
    clock = ManualClock()
    worker = Worker(app, WorkerConfig(concurrency=4, idle_min_s=0.01, idle_max_s=idle_max_s),
                    clock=clock)
    return worker, clock, claims


def test_burst_does_not_stop_while_its_own_finishing_jobs_hold_every_keys_slot(
        url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a queue with key_limit 1 and 3 jobs of one key, and a burst worker whose claim,
    # when it finds the key full with the worker's own running job, comes back only after
    # that job has finished: the order in which a finish and a claim crossed, which made a
    # burst worker stop with jobs left
    app, step, release = gated_app(url, {"key_limit": 1})
    for i in range(3):
        step.enqueue(job_id=f"s{i}", concurrency_key="k")
    q = app.queue("limited")
    worker = Worker(app, WorkerConfig(concurrency=4, burst=True))
    crossed: list[bool] = []

    def let_the_job_finish(jobs: list[leaseq.Job]) -> None:
        if not jobs and worker._snapshot() and not crossed:
            release.set()
            wait_until(lambda: not worker._snapshot(), what="the worker's job to finish")
            crossed.append(True)

    after_each_claim(monkeypatch, let_the_job_finish)
    # When the worker runs in burst mode
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    thread.join(30)
    release.set()
    assert not thread.is_alive()
    # Then it stopped only when every job was done, although a claim and a finish crossed
    assert crossed == [True]
    assert q.counts() == {"done": 3}
    app.store.close()


def test_a_worker_whose_key_limited_claim_came_back_short_waits_for_its_own_finishes(
        url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a worker (clock standing still) holding the only slot of a key_limit 1 queue's one
    # key, its claim come back short
    app, blocked, gate = gated_app(url, {"key_limit": 1})
    q = app.queue("limited")
    worker, clock, claims = still_worker(app, monkeypatch)
    # (Enqueued before the worker starts, so that its first claim takes it: a first claim
    # that ran before the enqueue would count an empty claim first.)
    blocked.enqueue(job_id="first", concurrency_key="k")
    try:
        with worker_thread(worker):
            wait_until(lambda: q.counts().get("processing") == 1, what="the first job")
            wait_until(lambda: claims and claims[-1] == 1, what="its claim")
            # When more jobs of the key arrive (each wakes the worker) while it runs
            for i in range(3):
                blocked.enqueue(job_id=f"more{i}", concurrency_key="k")
            # Then the worker does not claim again: the key is full with its own job, and
            # nothing of it has finished (its clock has not moved past idle_min_s)
            wait_until(lambda: q.counts().get("pending") == 3, what="3 more jobs")
            time.sleep(0.1)  # room for the wake-ups to make claims, were any made
            assert claims == [1]
            assert worker._full_keys.left_out("limited", clock.now, lambda: worker._holds(q),
                                              lambda: worker._finishing("limited"))
            before = len(claims)
            # When idle_min_s passes on its clock (another worker's job might have ended)
            clock.now += 0.011
            # Then it claims again, once, and finds the key still full
            wait_until(lambda: len(claims) > before, what="a claim after idle_min_s")
            assert claims[before] == 0
            # When its own job finishes, it claims the next one at once
            gate.set()
            wait_until(lambda: q.counts().get("done") == 4, what="every job done")
    finally:
        gate.set()
        app.store.close()


def test_a_worker_rechecks_a_full_key_only_once_its_own_job_being_finished_has_settled(
        url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a worker (clock standing still) whose job of a key_limit 1 queue's one key has
    # run, and whose completion is held before it is written
    app = leaseq.App(url, queues={"limited": {"key_limit": 1}})

    @app.task(queue="limited")
    def quick() -> None: ...

    writing, release = threading.Event(), threading.Event()
    store, complete_many = app.store, app.store.complete_many

    def held(queue: str, items: Any) -> Any:
        writing.set()
        release.wait(30)
        return complete_many(queue, items)

    monkeypatch.setattr(store, "complete_many", held)
    q = app.queue("limited")
    worker, clock, claims = still_worker(app, monkeypatch, idle_max_s=1.0)
    # (Enqueued before the worker starts, so that its first claim takes it: a first claim
    # that ran before the enqueue would count an empty claim first.)
    quick.enqueue(job_id="first", concurrency_key="k")
    try:
        with worker_thread(worker):
            wait_until(writing.is_set, what="the first job's completion")
            assert claims == [1]  # short of its 4 slots
            # When more jobs of the key arrive (each wakes the worker), and idle_min_s passes
            # on its clock while the completion is still being written
            for i in range(3):
                quick.enqueue(job_id=f"more{i}", concurrency_key="k")
            clock.now += 0.011
            time.sleep(0.1)  # room for the wake-ups to make claims, were any made
            # Then it makes no claim: its own job frees the key as soon as it is written
            assert claims == [1]
            # (Not for ever: past idle_max_s it polls as for any queue, and finds it full)
            clock.now += 1.0
            wait_until(lambda: len(claims) == 2, what="a claim after idle_max_s")
            assert claims == [1, 0]
            # When the completion is written, it claims the next job at once
            release.set()
            wait_until(lambda: q.counts().get("done") == 4, what="every job done")
    finally:
        release.set()
        app.store.close()
