"""What the worker writes for each thing a handler can do (DESIGN.md §3), sync and async."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
from worker_helpers import events, running, wait_until

import leaseq
from leaseq.worker import Worker, WorkerConfig


def burst(app: leaseq.App, **config: object) -> Worker:
    worker = Worker(app, WorkerConfig(burst=True, **config))  # type: ignore[arg-type]
    worker.run()
    return worker


def test_return_value_completes_with_result(app: leaseq.App) -> None:
    @app.task(queue="work")
    def add(a: int, b: int = 1) -> int:
        return a + b

    add.enqueue(a=2, job_id="j")
    burst(app)
    job = app.queue("work").get("j")
    assert job is not None and (job.status, job.result, job.attempts) == ("done", 3, 1)


def test_async_and_sync_tasks_run_side_by_side(app: leaseq.App) -> None:
    # Given async jobs that would take 5 × 0.2 s one after another, and a sync one
    @app.task(queue="work")
    async def wait_and_double(n: int) -> int:
        await asyncio.sleep(0.2)
        return n * 2

    @app.task(queue="work")
    def triple(n: int) -> int:
        return n * 3

    for n in range(5):
        wait_and_double.enqueue(n=n, job_id=f"async-{n}")
    triple.enqueue(n=7, job_id="sync")
    # When a burst worker runs them
    burst(app, concurrency=6)
    # Then every one is done with its own result
    q = app.queue("work")
    assert [q.get(f"async-{n}").result for n in range(5)] == [0, 2, 4, 6, 8]  # type: ignore[union-attr]
    assert q.get("sync").result == 21  # type: ignore[union-attr]


def test_async_failure_is_retried(app: leaseq.App) -> None:
    @app.task(queue="work")
    async def flaky(job: leaseq.Job) -> int:
        if job.attempt == 1:
            raise ConnectionError("upstream timed out")
        return job.attempt

    flaky.enqueue(job_id="f")
    burst(app)
    job = app.queue("work").get("f")
    assert job is not None and (job.status, job.result) == ("done", 2)
    assert "retry_scheduled" in events(app.queue("work"), "f")


def test_finish_sets_an_app_status_and_writes_follow_ups_with_the_result(app: leaseq.App) -> None:
    @app.task(queue="thumbs")
    def thumbnail(path: str) -> str:
        return f"thumb of {path}"

    @app.task(queue="work")
    def inspect_image(path: str, size: int) -> leaseq.Finish:
        if size > 100:
            return leaseq.Finish(status="skipped_too_large", result={"size": size})
        return leaseq.Finish(result="ok", then=[thumbnail.spec(path=path, job_id=f"t:{path}")])

    inspect_image.enqueue(path="big.png", size=500, job_id="big")
    inspect_image.enqueue(path="a.png", size=5, job_id="small")
    burst(app)  # a burst worker also drains the follow-ups it made
    work, thumbs = app.queue("work"), app.queue("thumbs")
    assert work.get("big").status == "skipped_too_large"  # type: ignore[union-attr]
    assert work.get("small").status == "done"  # type: ignore[union-attr]
    assert thumbs.get("t:a.png").result == "thumb of a.png"  # type: ignore[union-attr]
    assert thumbs.get("t:big.png") is None


def test_retry_then_success(app: leaseq.App) -> None:
    @app.task(queue="work")
    def later(job: leaseq.Job) -> int:
        if job.attempt < 3:
            raise leaseq.Retry("not yet", delay_s=0)
        return job.attempt

    later.enqueue(job_id="r")
    burst(app)
    job = app.queue("work").get("r")
    assert job is not None and (job.status, job.attempts) == ("done", 3)


def test_unexpected_exception_until_attempts_are_spent_ends_exhausted(app: leaseq.App) -> None:
    @app.task(queue="work", max_attempts=3)
    def broken() -> None:
        raise RuntimeError("decoder crashed")

    broken.enqueue(job_id="b")
    worker = burst(app)
    job = app.queue("work").get("b")
    assert job is not None
    assert (job.status, job.failure, job.attempts) == ("failed", "exhausted", 3)
    assert job.error == "RuntimeError: decoder crashed"
    assert _counter(worker, "leaseq_processed_total", queue="work", outcome="retried") == 2
    assert _counter(worker, "leaseq_processed_total", queue="work", outcome="exhausted") == 1


@pytest.mark.parametrize("outcome", [
    lambda: leaseq.Retry("soon", delay_s=-1), lambda: leaseq.Snooze(float("nan")),
    lambda: SystemExit(3)])
def test_a_handler_that_raises_a_bad_outcome_or_exits_fails_its_attempt(
    app: leaseq.App, outcome: Callable[[], BaseException]
) -> None:
    # Given a handler that raises a retry or snooze with a delay no store takes, or exits
    @app.task(queue="work", max_attempts=1)
    def bad(job: leaseq.Job) -> None:
        raise outcome()

    bad.enqueue(job_id="b")
    # When a burst worker runs it
    burst(app)
    # Then its attempt is written as failed at once, with the reason; it is not left
    # processing for its lease to run out
    job = app.queue("work").get("b")
    assert job is not None and (job.status, job.failure) == ("failed", "exhausted")
    assert ("delay_s must be" in (job.error or "")) or ("SystemExit" in (job.error or ""))


@pytest.mark.parametrize("raised", [leaseq.Permanent("bad input"), ValueError("bad input")])
def test_permanent_or_listed_exception_quarantines_at_once(
    app: leaseq.App, raised: Exception
) -> None:
    @app.task(queue="work", permanent=(ValueError,))
    def strict() -> None:
        raise raised

    strict.enqueue(job_id="p")
    burst(app)
    job = app.queue("work").get("p")
    assert job is not None and (job.status, job.failure, job.attempts) == ("failed", "permanent", 1)


def test_an_explicit_retry_is_retried_when_every_other_error_is_permanent(
    app: leaseq.App
) -> None:
    # Given a task whose every error is permanent unless it says Retry
    @app.task(queue="work", permanent=(Exception,))
    def careful(job: leaseq.Job) -> str:
        if job.attempts == 1:
            raise leaseq.Retry("upstream 503", delay_s=0)
        return "ran"

    careful.enqueue(job_id="r")
    # When it asks for a retry, Then it is retried (not quarantined as permanent), and runs
    burst(app)
    job = app.queue("work").get("r")
    assert job is not None and (job.status, job.attempts) == ("done", 2)
    assert "retry_scheduled" in events(app.queue("work"), "r")


def test_snooze_gives_the_attempt_back(app: leaseq.App) -> None:
    @app.task(queue="work")
    def busy(job: leaseq.Job) -> str:
        if job.lease_epoch == 1:
            raise leaseq.Snooze(0, "rate limited")
        return "ran"

    busy.enqueue(job_id="s")
    burst(app)
    job = app.queue("work").get("s")
    assert job is not None and (job.status, job.attempts, job.lease_epoch) == ("done", 1, 2)
    assert "snoozed" in events(app.queue("work"), "s")


def test_snooze_without_a_delay_does_not_spin(app: leaseq.App) -> None:
    # Given a handler that snoozes on a condition that does not clear, no delay given
    runs: list[float] = []

    @app.task(queue="work")
    def wait_for_upstream() -> None:
        runs.append(time.monotonic())
        raise leaseq.Snooze(reason="upstream not ready")

    wait_for_upstream.enqueue(job_id="s")
    q = app.queue("work")
    # When a worker serves the queue for a second
    with running(app):
        wait_until(lambda: runs, what="the first run")
        time.sleep(1.0)  # the window in which runs are counted
    # Then it ran once: the next run waits the policy's snooze_s (5 s), it does not spin
    assert len(runs) == 1
    job = q.get("s")
    assert job is not None and (job.status, job.attempts, job.snoozes) == ("pending", 0, 1)
    # not-before and updated_at come from the one statement that snoozed it
    wait_s = (job.lease_until - job.updated_at).total_seconds()  # type: ignore[operator]
    assert abs(wait_s - 5.0) < 0.01


@pytest.mark.parametrize("set_on", ["queue", "task"])
def test_a_snooze_that_never_clears_ends_exhausted(app: leaseq.App, set_on: str) -> None:
    # Given a handler that always snoozes, under a policy (the queue's, or its task's own)
    # that allows 3 snoozes, due at once
    bounds = {"snooze_s": 0.0, "max_snoozes": 3}
    app.configure_queue("polling", bounds if set_on == "queue" else {})
    runs: list[int] = []

    @app.task(queue="polling", **(bounds if set_on == "task" else {}))  # type: ignore[arg-type]
    def wait_forever() -> None:
        runs.append(1)
        raise leaseq.Snooze()

    wait_forever.enqueue(job_id="w")
    # When a burst worker runs it until nothing is left
    worker = burst(app)
    # Then the fourth snooze ended it, with a reason that says so
    job = app.queue("polling").get("w")
    assert job is not None and (job.status, job.failure, job.snoozes) == (
        "failed", "exhausted", 4)
    assert job.error == "snoozed 4 times without finishing"
    assert len(runs) == 4
    assert _counter(worker, "leaseq_processed_total", queue="polling", outcome="snoozed") == 3
    assert _counter(worker, "leaseq_processed_total", queue="polling", outcome="exhausted") == 1


def test_unknown_task_and_payload_that_no_longer_fits_are_invalid(app: leaseq.App) -> None:
    @app.task(queue="work")
    def resize(path: str, width: int) -> None: ...

    q = app.queue("work")
    q.enqueue("renamed", {"path": "a"}, task="old_name")  # the task was renamed since
    q.enqueue("no-task", {"path": "a"})
    q.enqueue("drifted", {"path": "a"}, task="resize")  # enqueued before `width` was added
    burst(app)
    for job_id, reason in [("renamed", "unknown task 'old_name'"), ("no-task", "no task"),
                           ("drifted", "missing argument(s) width")]:
        job = q.get(job_id)
        assert job is not None and (job.status, job.failure) == ("failed", "invalid"), job_id
        assert reason in (job.error or "")


def test_result_that_is_not_json_is_a_permanent_failure(app: leaseq.App) -> None:
    @app.task(queue="work")
    def odd() -> object:
        return {1, 2}

    odd.enqueue(job_id="o")
    burst(app)
    job = app.queue("work").get("o")
    assert job is not None and (job.status, job.failure) == ("failed", "permanent")


def test_a_follow_up_of_the_wrong_shape_fails_the_job_for_good_at_once(app: leaseq.App) -> None:
    # Given a handler that passes one spec as `then`, not a list of them (an easy slip)
    runs: list[int] = []

    @app.task(queue="work")
    def child(x: int) -> None:
        return None

    @app.task(queue="work")
    def parent() -> leaseq.Finish:
        runs.append(1)
        return leaseq.Finish(result="ok", then=child.spec(x=1))  # type: ignore[arg-type]

    parent.enqueue(job_id="p")
    burst(app)
    # Then the job fails for good, saying why, after one run (it stayed processing without
    # an outcome, ran again each attempt, and ended failed(expired) with the cause lost)
    job = app.queue("work").get("p")
    assert job is not None and (job.status, job.failure) == ("failed", "permanent")
    assert "follow-up" in (job.error or "") and runs == [1]


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.parametrize("error", [ValueError("cannot parse report-\udcff.csv"), Unprintable()],
                         ids=["lone surrogate", "__str__ raises"])
def test_an_error_whose_text_no_store_can_keep_is_retried_as_any_other(
        app: leaseq.App, error: Exception) -> None:
    # Given a handler that fails once with an error whose text has a lone surrogate (a file
    # name from os.listdir) or cannot be made at all
    @app.task(queue="work")
    def parse(job: leaseq.Job) -> int:
        if job.attempt == 1:
            raise error
        return job.attempt

    parse.enqueue(job_id="e")
    burst(app)
    # Then the retry is written (the driver refused the text: the job stayed processing)
    q = app.queue("work")
    job = q.get("e")
    assert job is not None and (job.status, job.attempts) == ("done", 2)
    reason = next(e.reason for e in q.journal("e") if e.event == "retry_scheduled")
    assert "\\udcff" in reason or "<unprintable Unprintable>" in reason


def test_an_outcome_the_store_cannot_take_fails_the_job_for_good(
        app: leaseq.App, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a store whose retry write raises what no retry can help (a driver's own error)
    @app.task(queue="work")
    def flaky() -> None:
        raise RuntimeError("upstream 503")

    def refuse(*args: object, **kwargs: object) -> None:
        raise TypeError("the driver cannot adapt this value")

    monkeypatch.setattr(app.store, "retry_later", refuse)
    flaky.enqueue(job_id="f")
    burst(app)
    # Then the job fails for good with that reason, rather than stay processing unwritten
    job = app.queue("work").get("f")
    assert job is not None and (job.status, job.failure) == ("failed", "permanent")
    assert "could not be written: TypeError: the driver cannot adapt" in (job.error or "")


def test_burst_exits_with_nothing_to_do(app: leaseq.App) -> None:
    @app.task(queue="work")
    def noop() -> None: ...

    # An empty queue: run() returns by itself (the test would time out otherwise)
    burst(app)
    # A job that is not due yet is not claimable: burst does not wait for it
    noop.enqueue(job_id="later", delay_s=3600)
    burst(app)
    assert app.queue("work").get("later").status == "pending"  # type: ignore[union-attr]


def test_burst_does_not_stop_while_a_settled_job_still_holds_its_slot(
        app: leaseq.App) -> None:
    # Given two async jobs for a worker of one slot, and a handler run that goes on a moment
    # after its job's outcome is written (as a wrapper's clean-up does: the Django worker
    # closes the job's connections there), held until the loop has looked at the worker with
    # nothing in flight and the slot still taken
    @app.task(queue="work")
    async def one(n: int) -> int:
        return n

    one.enqueue(n=1, job_id="first")
    one.enqueue(n=2, job_id="second")
    worker = Worker(app, WorkerConfig(burst=True, concurrency=1, prefetch=0))
    saw_the_window = threading.Event()
    wants_claim = worker._wants_claim

    def watched() -> bool:
        if not worker._snapshot() and worker._room() == 0:
            saw_the_window.set()
        return wants_claim()

    worker._wants_claim = watched  # type: ignore[method-assign]
    run_async = worker._runner.run_async

    async def cleans_up_after(item: object, finish_in: Callable[..., object]) -> str:
        try:
            return await run_async(item, finish_in)  # type: ignore[arg-type]
        finally:
            await asyncio.to_thread(saw_the_window.wait, 10)

    worker._runner.run_async = cleans_up_after  # type: ignore[method-assign]
    # When it runs in burst mode
    worker.run()
    # Then it claimed the second job once the first's slot was free (it had stopped: nothing
    # in flight, and no room to claim, read as nothing claimable)
    assert saw_the_window.is_set()
    q = app.queue("work")
    assert [q.get(j).status for j in ("first", "second")] == ["done", "done"]  # type: ignore[union-attr]


def test_enqueue_in_the_same_process_wakes_an_idle_worker(app: leaseq.App) -> None:
    # Given a worker whose idle wait is 60 s
    @app.task(queue="work")
    def ping() -> str:
        return "pong"

    store = app.store
    waiting = threading.Event()
    real_wait = store.wait_for_work

    def observed_wait(queues: list[str], timeout_s: float) -> bool:
        waiting.set()
        return real_wait(queues, timeout_s)

    store.wait_for_work = observed_wait  # type: ignore[method-assign]
    with running(app, idle_min_s=60, idle_max_s=60) as worker:
        assert waiting.wait(10), "the worker never went idle"
        # When a job is enqueued through the same store
        ping.enqueue(job_id="w")
        # Then it runs long before the idle wait would have ended
        wait_until(lambda: app.queue("work").is_finished("w"), timeout_s=20)
        assert worker.in_flight() == []


def test_concurrency_bounds_jobs_in_flight(app: leaseq.App) -> None:
    gate = threading.Event()
    inside = []
    lock = threading.Lock()
    peak = [0]

    @app.task(queue="work")
    def hold(n: int) -> None:
        with lock:
            inside.append(n)
            peak[0] = max(peak[0], len(inside))
        gate.wait(10)
        with lock:
            inside.remove(n)

    for n in range(6):
        hold.enqueue(n=n, job_id=f"h{n}")
    with running(app, concurrency=2) as worker:
        wait_until(lambda: len(worker.in_flight()) == 2)
        assert app.queue("work").counts() == {"pending": 4, "processing": 2}
        gate.set()
        wait_until(lambda: app.queue("work").counts() == {"done": 6})
    assert peak[0] == 2


def _counter(worker: Worker, name: str, **labels: str) -> float:
    value = worker.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def test_a_cancelled_error_of_the_handlers_own_is_a_failed_attempt(app: leaseq.App) -> None:
    # Given an async handler whose own child task is cancelled (by a library, say), so a
    # CancelledError leaves the handler on its first attempt
    @app.task(queue="work", max_attempts=2, backoff_base_s=0.0)
    async def cancels_its_child(job: leaseq.Job) -> int:
        if job.attempt == 1:
            child = asyncio.ensure_future(asyncio.sleep(10))
            await asyncio.sleep(0)
            child.cancel()
            await child
        return job.attempt

    cancels_its_child.enqueue(job_id="c")
    # When a burst worker runs it
    burst(app)
    # Then the attempt failed with its error and was retried (not given back as at shutdown)
    job = app.queue("work").get("c")
    assert job is not None and (job.status, job.result, job.givebacks) == ("done", 2, 0)
    assert events(app.queue("work"), "c") == [
        "enqueued", "claimed", "retry_scheduled", "claimed", "result_saved"]
    retried = [e for e in app.queue("work").journal("c") if e.event == "retry_scheduled"]
    assert "CancelledError" in (retried[0].reason or "")


def test_a_running_async_handler_the_worker_cancels_is_given_back(app: leaseq.App) -> None:
    # Given an async handler awaiting a child task of its own when the worker stops
    started = threading.Event()

    @app.task(queue="work")
    async def waits_on_a_child(job: leaseq.Job) -> None:
        if job.givebacks == 0:
            started.set()
            await asyncio.ensure_future(asyncio.sleep(60))

    waits_on_a_child.enqueue(job_id="w")
    # When the worker's grace period ends and it cancels the handler
    with running(app, grace_s=0.1):
        assert started.wait(10)
    # Then the job is given back (counted: it ran), with no failed attempt written
    job = app.queue("work").get("w")
    assert job is not None and (job.status, job.attempts, job.givebacks, job.error) == (
        "pending", 0, 1, None)
    assert events(app.queue("work"), "w")[-1] == "given_back"
