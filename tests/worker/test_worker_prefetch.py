"""Prefetch: a worker claims ahead of its free slots only as far as its handlers keep up, and
a prefetched job that cannot start soon goes back at once, free, for another worker."""

from __future__ import annotations

import threading
from pathlib import Path

from test_worker_processes import proc_app, worker_process  # noqa: F401 (fixture)
from worker_helpers import wait_until

import leaseq
from leaseq.lifecycle import NOT_STARTED_REASON
from leaseq.worker import PREFETCH_REASON, Worker, WorkerConfig


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_prefetched_job_that_waits_too_long_goes_back_free(app: leaseq.App) -> None:
    # Given a worker (4 slots, prefetch up to 8) whose clock stands still, so its handlers'
    # recent finishes keep earning it a prefetch allowance
    gate = threading.Event()

    @app.task(queue="work")
    def quick() -> None:
        return None

    @app.task(queue="work")
    def blocked() -> None:
        gate.wait(30)

    q = app.queue("work")
    clock = ManualClock()
    worker = Worker(app, WorkerConfig(concurrency=4, prefetch=8, prefetch_wait_s=0.25,
                                      idle_max_s=0.05), clock=clock)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        for i in range(8):
            quick.enqueue(job_id=f"q{i}")
        wait_until(lambda: q.counts().get("done") == 8, what="the quick jobs")
        # When 8 jobs that hold their slot arrive at once
        for i in range(8):
            blocked.enqueue(job_id=f"b{i}")
        # Then the worker takes all 8 in one claim: 4 run, 4 wait for a slot
        wait_until(lambda: q.counts().get("processing") == 8, what="8 jobs claimed")
        claims = {e.worker_id for i in range(8) for e in q.journal(f"b{i}")
                  if e.event == "claimed"}
        assert claims == {worker.worker_id}
        # (and its 4 slots have started theirs: until then the loop is still taking them off
        # the waiting list, and a clock moved now would give one of those back too)
        wait_until(lambda: worker._running == 4, what="4 jobs started")
        # When the waiting ones have waited longer than prefetch_wait_s
        clock.now += 0.3
        # Then they go back at once, free (attempt refunded, not a counted give-back) ...
        wait_until(lambda: q.counts().get("pending") == 4, what="4 jobs given back")
        back = [q.get(f"b{i}") for i in range(8)]
        given = [j for j in back if j is not None and j.status == "pending"]
        assert [(j.attempts, j.givebacks) for j in given] == [(0, 0)] * 4
        assert all(q.journal(j.id)[-1].reason == PREFETCH_REASON for j in given)
        # ... and the worker, its slots full, does not take them again
        wait_until(lambda: not worker._ready, what="the prefetch queue to empty")
        assert worker._room() == 0
        assert q.counts().get("pending") == 4
    finally:
        gate.set()
        worker.request_stop()
        thread.join(30)
    assert not thread.is_alive()


def test_two_workers_start_8_long_jobs_none_waiting_behind_another(
    proc_app: leaseq.App, url: str, tmp_path: Path  # noqa: F811 (fixture)
) -> None:
    # Given two worker processes with 4 slots each, warmed up by quick jobs so that both have
    # earned a prefetch allowance
    starts = tmp_path / "starts"
    tasks = proc_app.tasks
    with worker_process(url, "--concurrency", "4"), worker_process(url, "--concurrency", "4"):
        # When 8 jobs of 8 s each are queued right behind 64 quick ones (the worker that
        # takes the quick jobs' tail claims long ones ahead of its slots)
        q = proc_app.queue("work")
        proc_app.enqueue_many([*(tasks["quick"].spec(n=i, job_id=f"a{i:03}") for i in range(64)),
                        *(tasks["long_job"].spec(starts=str(starts), n=i, seconds=8.0,
                                                 job_id=f"b{i}") for i in range(8))])
        # Then all 8 start before the first of them could have ended: none waits behind
        # another's 8 s (a prefetched job goes back after prefetch_wait_s, 0.5 s; the rest of
        # the bound is for a busy machine's process wake-ups; the workers are killed at the
        # end, so the jobs' length costs the test nothing)
        wait_until(lambda: _started(starts) == 8, timeout_s=20, what="8 long jobs started")
        times = sorted(float(line.split()[1]) for line in starts.read_text().splitlines())
        assert times[-1] - times[0] < 7.0, times
        # And a job given back from a prefetch was free: every long job is on attempt 1
        assert all(q.get(f"b{i}").attempts == 1 for i in range(8))  # type: ignore[union-attr]


def _started(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _held_app(app: leaseq.App, ran: list[str], gate: threading.Event) -> Worker:
    """A worker of one slot that has earned a prefetch allowance (20 quick jobs done), and
    whose ``held`` task blocks job "a" until ``gate`` opens; the jobs beat every 0.1 s."""

    @app.task(queue="work", lease_s=3.0, heartbeat_every_s=0.1)
    def quick() -> None:
        return None

    @app.task(queue="work", lease_s=3.0, heartbeat_every_s=0.1)
    def held(name: str) -> None:
        ran.append(name)
        if name == "a":
            assert gate.wait(20)

    worker = Worker(app, WorkerConfig(concurrency=1, prefetch=4, prefetch_wait_s=10.0,
                                      idle_max_s=0.05))
    thread = threading.Thread(target=worker.run, kwargs={"stop_event": worker_stop(worker)},
                              daemon=True)
    thread.start()
    worker.thread = thread  # type: ignore[attr-defined]
    q = app.queue("work")
    for i in range(20):
        quick.enqueue(job_id=f"q{i:02}")
    wait_until(lambda: q.counts().get("done") == 20, what="the quick jobs")
    app.enqueue_many([held.spec(name="a", job_id="a"), held.spec(name="b", job_id="b")])
    wait_until(lambda: q.counts().get("processing") == 2, what="both claimed")
    assert ran == ["a"]  # "b" waits for the slot
    return worker


def worker_stop(worker: Worker) -> threading.Event:
    worker.stop = threading.Event()  # type: ignore[attr-defined]
    return worker.stop  # type: ignore[attr-defined]


def test_a_prefetched_job_cancelled_while_it_waits_never_starts(app: leaseq.App) -> None:
    # Given a job waiting for the slot of a worker whose one slot is busy
    ran: list[str] = []
    gate = threading.Event()
    worker = _held_app(app, ran, gate)
    q = app.queue("work")
    try:
        # When an operator cancels it, and a beat finds its lease gone
        assert q.cancel("b")
        lost = worker.metrics.registry.get_sample_value
        wait_until(lambda: lost("leaseq_lease_lost_total", {"queue": "work"}) == 1,
                   what="the lost lease")
        # And the slot frees
        gate.set()
        wait_until(lambda: q.is_finished("a") and worker.in_flight() == [], what="a to end")
    finally:
        gate.set()
        worker.stop.set()  # type: ignore[attr-defined]
        worker.thread.join(30)  # type: ignore[attr-defined]
    # Then it never ran: its handler's side effects are not done for a cancelled job
    assert ran == ["a"]
    job = q.get("b")
    assert job is not None and job.status == "cancelled"
    assert worker._settled_first == 0  # and no slot is counted as still taken


def test_a_prefetched_job_does_not_start_once_a_stop_was_asked(app: leaseq.App) -> None:
    # Given a job waiting for the slot of a worker whose one slot is busy
    ran: list[str] = []
    gate = threading.Event()
    worker = _held_app(app, ran, gate)
    # When the worker is told to stop (its stop_event, as a signal would) and the slot frees
    # at once, before the loop has looked
    worker.stop.set()  # type: ignore[attr-defined]
    gate.set()
    worker.thread.join(30)  # type: ignore[attr-defined]
    # Then the waiting job never started: it went back free, for another worker to start
    assert ran == ["a"]
    job = app.queue("work").get("b")
    assert job is not None and (job.status, job.attempts, job.givebacks) == ("pending", 0, 0)
    # said as a stop's, not as a slot too slow to start it
    assert app.queue("work").journal("b")[-1].reason == NOT_STARTED_REASON
