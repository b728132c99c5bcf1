"""Leases while a job runs: the heartbeat keeps them, a lost one discards the result, and a
stop gives in-flight jobs back."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from worker_helpers import events, running, wait_until

import leaseq
from leaseq import deadline, lifecycle
from leaseq.browse import BulkAction
from leaseq.errors import LeaseLost, StoreUnavailable
from leaseq.stores import connect

LEASE_S = 1.0
BEAT_S = 0.1
#: The lease of a handler that must keep it while beats run: ten beat intervals would do on a
#: quiet machine, not on CI (a stalled heartbeat thread would run the lease clock out).
BUSY_LEASE_S = 3.0


def test_a_job_deleted_and_enqueued_again_while_it_runs_keeps_the_new_lifes_result(
        app: leaseq.App) -> None:
    # Given a handler that runs until the test releases its job's life, beating rarely (no
    # beat may notice the cancel below before the job is claimed again)
    release = {1: threading.Event(), 2: threading.Event()}

    @app.task(queue="work", lease_s=90.0, heartbeat_every_s=30.0)
    def export(life: int) -> str:
        assert release[life].wait(20)
        return f"life {life}"

    export.enqueue(job_id="r", life=1)
    q = app.queue("work")
    with running(app, concurrency=2) as worker:
        wait_until(lambda: q.get("r").status == "processing")  # type: ignore[union-attr]
        # When an operator cancels and deletes it and enqueues it again, and this same worker
        # claims the new job (same worker id, and a new record's epochs start again)
        assert q.cancel("r")
        assert q.store.act_on_jobs("work", BulkAction.DELETE, ["r"], "ops").acted == ["r"]
        export.enqueue(job_id="r", life=2)
        wait_until(lambda: q.get("r").status == "processing")  # type: ignore[union-attr]
        # And the first life finishes while the second runs
        release[1].set()
        lost = worker.metrics.registry.get_sample_value
        wait_until(lambda: q.get("r").status != "processing"  # type: ignore[union-attr]
                   or lost("leaseq_lease_lost_total", {"queue": "work"}) == 1)
        # Then its result is discarded: the job still runs, under the second life
        job = q.get("r")
        assert job is not None and job.status == "processing"
        release[2].set()
        wait_until(lambda: q.is_finished("r"))
    job = q.get("r")
    assert job is not None and (job.status, job.result) == ("done", "life 2")


def test_the_broker_consumers_executor_keeps_the_new_lifes_result_too(url: str) -> None:
    # Given the consumer's executor running job r, claimed by consumer-1, until released
    from leaseq.delivery.execute import AppExecutor

    app = leaseq.App(url, queues={"work": {"lease_s": 90.0, "heartbeat_every_s": 30.0}})
    release = {1: threading.Event(), 2: threading.Event()}

    started: list[int] = []

    @app.task(queue="work")
    def export(life: int) -> str:
        started.append(life)
        assert release[life].wait(20)
        return f"life {life}"

    q = app.queue("work")
    executor = AppExecutor(app)
    outcomes: dict[int, object] = {}

    def deliver(life: int) -> None:
        job = q.claim_one("r", "consumer-1")
        assert job is not None and job.payload == {"life": life}

        def run() -> None:
            try:
                outcomes[life] = executor.run_claimed(job, time.monotonic())
            except Exception as exc:  # the outcome under test
                outcomes[life] = exc
        threading.Thread(target=run, daemon=True).start()

    try:
        export.enqueue(job_id="r", life=1)
        deliver(1)
        # When the job is cancelled, deleted and enqueued again, and the same consumer runs
        # its new life (a new record: the same epoch, the same worker id)
        assert q.cancel("r")
        assert app.store.act_on_jobs("work", BulkAction.DELETE, ["r"], "ops").acted == ["r"]
        export.enqueue(job_id="r", life=2)
        deliver(2)
        # And the first life finishes while the second runs (its handler started: before the
        # executor holds the second claim, nothing here can tell the lives apart)
        wait_until(lambda: 2 in started)
        release[1].set()
        wait_until(lambda: 1 in outcomes)
        # Then its result was refused, and the second life's is the one kept
        assert isinstance(outcomes[1], LeaseLost)
        assert q.get("r").status == "processing"  # type: ignore[union-attr]
        release[2].set()
        wait_until(lambda: 2 in outcomes)
        job = q.get("r")
        assert job is not None and (job.status, job.result) == ("done", "life 2")
    finally:
        release[1].set()
        release[2].set()
        executor.close()
        app.store.close()


def test_the_consumers_executor_given_a_jobs_two_lives_in_the_other_order_runs_only_the_new(
        url: str) -> None:
    # Given one consumer's two deliveries of job r: its first life, claimed, then cancelled,
    # deleted and enqueued again, and its second life, claimed by the same consumer (the same
    # worker id and epoch: the store's fence cannot tell the two leases apart)
    from leaseq.delivery.execute import AppExecutor

    app = leaseq.App(url, queues={"work": {"lease_s": 90.0, "heartbeat_every_s": 30.0}})
    release = threading.Event()
    ran: list[int] = []

    @app.task(queue="work")
    def export(life: int) -> str:
        ran.append(life)
        assert release.wait(20)
        return f"life {life}"

    q = app.queue("work")
    executor = AppExecutor(app)
    try:
        export.enqueue(job_id="r", life=1)
        sent = {1: time.monotonic()}
        first = q.claim_one("r", "consumer-1")
        assert q.cancel("r")
        assert app.store.act_on_jobs("work", BulkAction.DELETE, ["r"], "ops").acted == ["r"]
        export.enqueue(job_id="r", life=2)
        sent[2] = time.monotonic()
        second = q.claim_one("r", "consumer-1")
        assert first is not None and second is not None
        # When the second life's delivery reaches the executor first (threads race), then the
        # first life's
        outcomes: dict[int, object] = {}

        def run(life: int, job: leaseq.Job) -> None:
            try:
                outcomes[life] = executor.run_claimed(job, sent[life])
            except Exception as exc:  # the outcome under test
                outcomes[life] = exc

        threading.Thread(target=run, args=(2, second), daemon=True).start()
        wait_until(lambda: ran == [2])
        run(1, first)
        # Then the first life never runs (its lease is gone), and the second life's is kept
        assert isinstance(outcomes[1], LeaseLost) and ran == [2]
        release.set()
        wait_until(lambda: 2 in outcomes)
        job = q.get("r")
        assert job is not None and (job.status, job.result) == ("done", "life 2")
    finally:
        release.set()
        executor.close()

def test_heartbeat_keeps_a_busy_job_from_being_reclaimed(app: leaseq.App, url: str) -> None:
    # Given a handler that burns CPU for one and a half leases. The lease is long enough that
    # a loaded machine's stalls (a beat waits at most half its interval, then tries again)
    # cannot run the local lease clock out: only a heartbeat that stopped would lose it.
    @app.task(queue="work", lease_s=BUSY_LEASE_S, heartbeat_every_s=BEAT_S)
    def crunch() -> int:
        deadline = time.monotonic() + 1.5 * BUSY_LEASE_S
        n = 0
        while time.monotonic() < deadline:
            n += 1
        return n

    crunch.enqueue(job_id="c")
    thief = connect(url).queue("work")
    stolen: list = []
    with running(app):
        wait_until(lambda: app.queue("work").get("c").status == "processing")  # type: ignore[union-attr]
        # When another worker keeps trying to take it and a sweeper keeps reclaiming, until
        # it is done or taken (a taken job would stay with the thief: stop looking then)
        give_up_at = time.monotonic() + 10 * BUSY_LEASE_S
        while not (app.queue("work").is_finished("c") or stolen) and time.monotonic() < give_up_at:
            stolen += thief.claim("thief", 1)
            thief.reclaim_expired()
            time.sleep(0.05)
    # Then nobody took it: one attempt, done, never reclaimed
    assert stolen == []
    job = app.queue("work").get("c")
    assert job is not None and (job.status, job.attempts) == ("done", 1)
    assert events(app.queue("work"), "c") == ["enqueued", "claimed", "result_saved"]
    thief.store.close()


def test_cancelled_job_loses_its_lease_and_the_result_is_discarded(app: leaseq.App) -> None:
    # Given a long handler that watches job.lease_lost
    saw_loss = threading.Event()

    # (the busy test's lease: the next beat finds the cancel, never the lease clock first)
    @app.task(queue="work", lease_s=BUSY_LEASE_S, heartbeat_every_s=BEAT_S)
    def long_report(job: leaseq.Job) -> str:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not job.lease_lost:
            time.sleep(0.01)
        if job.lease_lost:
            saw_loss.set()
        return "report"

    long_report.enqueue(job_id="r")
    q = app.queue("work")
    with running(app) as worker:
        wait_until(lambda: q.get("r").status == "processing")  # type: ignore[union-attr]
        # When an operator cancels it mid-run
        assert q.cancel("r")
        # Then the next beat finds the lease gone and the handler is told
        assert saw_loss.wait(10)
        wait_until(lambda: worker.in_flight() == [])
    job = q.get("r")
    assert job is not None and (job.status, job.result) == ("cancelled", None)
    assert events(q, "r")[-2:] == ["cancelled", "heartbeat_lost"]
    assert worker.metrics.registry.get_sample_value(
        "leaseq_lease_lost_total", {"queue": "work"}) == 1
    assert worker.metrics.registry.get_sample_value(
        "leaseq_processed_total", {"queue": "work", "outcome": "done"}) is None


def test_a_cancelled_async_job_is_cancelled_and_its_slot_runs_the_next(
        app: leaseq.App) -> None:
    # Given a worker of one slot running an async handler that would run for 20 s
    started, cancelled = threading.Event(), threading.Event()

    @app.task(queue="work", lease_s=BUSY_LEASE_S, heartbeat_every_s=BEAT_S)
    async def long_async() -> None:
        started.set()
        try:
            await asyncio.sleep(20)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    @app.task(queue="work")
    def after() -> str:
        return "next"

    long_async.enqueue(job_id="c")
    q = app.queue("work")
    with running(app, concurrency=1):
        assert started.wait(10)
        # When an operator cancels it mid-run
        assert q.cancel("c")
        # Then the next beat finds the lease gone and the handler is cancelled (its result
        # would be discarded), and its slot runs the next job
        assert cancelled.wait(10)
        after.enqueue(job_id="n")
        wait_until(lambda: q.is_finished("n"))
    assert [q.get(i).status for i in ("c", "n")] == ["cancelled", "done"]  # type: ignore
    assert events(q, "c")[-2:] == ["cancelled", "heartbeat_lost"]


def test_a_sync_job_whose_lease_is_lost_frees_its_slot_while_it_runs_on(
        app: leaseq.App) -> None:
    # Given a worker of one slot running a sync handler that does not watch its lease
    release = threading.Event()

    @app.task(queue="work", lease_s=BUSY_LEASE_S, heartbeat_every_s=BEAT_S)
    def stubborn() -> str:
        assert release.wait(60)
        return "late"

    @app.task(queue="work")
    def after() -> str:
        return "next"

    stubborn.enqueue(job_id="s")
    q = app.queue("work")
    try:
        with running(app, concurrency=1):
            wait_until(lambda: q.get("s").status == "processing")  # type: ignore[union-attr]
            # When an operator cancels it
            assert q.cancel("s")
            # Then its slot is free once a beat finds the lease gone: the next job runs
            # while the old handler is still in its thread
            after.enqueue(job_id="n")
            wait_until(lambda: q.is_finished("n"), timeout_s=20)
            assert not release.is_set()
            release.set()
    finally:
        release.set()
    assert [q.get(i).status for i in ("s", "n")] == ["cancelled", "done"]  # type: ignore


def test_stolen_lease_refuses_the_old_workers_result(app: leaseq.App, url: str) -> None:
    # Given a handler stuck past its lease whose heartbeat cannot help (it beats rarely)
    release = threading.Event()

    @app.task(queue="work", lease_s=LEASE_S, heartbeat_every_s=0.9 * LEASE_S)
    def stuck() -> str:
        release.wait(20)
        return "old result"

    stuck.enqueue(job_id="s")
    q = app.queue("work")
    with running(app) as worker:
        wait_until(lambda: q.get("s").status == "processing")  # type: ignore[union-attr]
        # When another worker, whose clock is past the lease, takes the job and finishes it
        thief_store = connect(url, time_offset_s=5 * LEASE_S)
        thief = thief_store.queue("work")
        (job,) = thief.claim("thief", 1)
        thief.complete(job, "new result")
        release.set()
        wait_until(lambda: worker.in_flight() == [])
    # Then the old worker's result was refused; the thief's stands
    final = q.get("s")
    assert final is not None and (final.status, final.result) == ("done", "new result")
    assert final.lease_epoch == 2
    assert worker.metrics.registry.get_sample_value(
        "leaseq_lease_lost_total", {"queue": "work"}) == 1
    thief_store.close()


def test_task_lease_longer_than_the_queue_lease_is_set_by_the_first_beat(
    app: leaseq.App
) -> None:
    # Given a queue lease of 1 s and, on the same queue, a task with a 30 s lease
    app.configure_queue("short", {"lease_s": LEASE_S})
    release = threading.Event()

    @app.task(queue="short")
    def quick() -> None: ...

    @app.task(queue="short", lease_s=30.0)
    def report() -> None:
        release.wait(20)

    report.enqueue(job_id="r")
    q = app.queue("short")
    with running(app):
        wait_until(lambda: q.get("r").status == "processing")  # type: ignore[union-attr]
        claimed_until = q.get("r").lease_until  # type: ignore[union-attr]
        # When the first beat comes (within a third of the claim's lease)
        wait_until(lambda: q.get("r").lease_until > claimed_until)  # type: ignore[union-attr, operator]
        remaining = (q.get("r").lease_until - q.store.server_now()).total_seconds()  # type: ignore[union-attr, operator]
        release.set()
        wait_until(lambda: q.is_finished("r"))
    # Then the lease is the task's own
    assert remaining > 10


def test_stop_lets_a_short_job_finish_and_gives_a_long_one_back(app: leaseq.App) -> None:
    # Given one job that ends soon and one that will not end within the grace period
    release = threading.Event()

    @app.task(queue="work")
    def job_of(seconds: float) -> str:
        release.wait(seconds)
        return "finished"

    job_of.enqueue(seconds=0.3, job_id="short")
    job_of.enqueue(seconds=30, job_id="long")
    q = app.queue("work")
    with running(app, grace_s=1.0) as worker:
        wait_until(lambda: len(worker.in_flight()) == 2)
        # When the worker is asked to stop (the block's end)
    # Then the short job finished and the long one is ready again with its attempt back
    short, long = q.get("short"), q.get("long")
    assert short is not None and short.status == "done"
    assert long is not None and (long.status, long.attempts, long.givebacks) == ("pending", 0, 1)
    assert q.ready() == 1
    assert events(q, "long")[-1] == "given_back"
    assert "shutting down" in (q.journal("long")[-1].reason or "")
    # And the abandoned handler's late result is discarded
    release.set()
    wait_until(lambda: worker.in_flight() == [])  # the handler returned...
    assert q.get("long").status == "pending"  # type: ignore[union-attr]  # ...to no effect


def test_a_job_that_outlives_every_grace_period_spends_its_attempts_and_ends(
    app: leaseq.App
) -> None:
    # Given a handler that never ends within a grace period, on a queue with 2 attempts of
    # which 1 give-back of a running handler is free
    app.configure_queue("slow", {"max_attempts": 2, "max_givebacks": 1})
    release = threading.Event()
    runs: list[int] = []

    @app.task(queue="slow")
    def endless(job: leaseq.Job) -> None:
        runs.append(job.attempt)
        release.wait(60)

    endless.enqueue(job_id="e")
    q = app.queue("slow")
    stops = 0
    try:
        # When workers keep being stopped while it runs (a scale-down every cool-down)
        while q.get("e").status == "pending" and stops < 10:  # type: ignore[union-attr]
            with running(app, grace_s=0.1):
                wait_until(lambda n=stops + 1: len(runs) == n, what="the handler to start")
            stops += 1
    finally:
        release.set()
    # Then the first give-back was free, the next ones spent the attempts, and it ended
    job = q.get("e")
    assert job is not None and (job.status, job.failure) == ("failed", "exhausted")
    assert (job.attempts, job.givebacks, stops) == (2, 1, 3)
    assert "given back 1 times" in (job.error or "")
    assert events(q, "e").count("given_back") == 2


def test_a_job_whose_handler_never_started_is_given_back_free(app: leaseq.App) -> None:
    # Given two async jobs, the first of which blocks the event loop, so the second never
    # gets to start
    release = threading.Event()
    started: list[str] = []

    @app.task(queue="work")
    async def hog(name: str) -> None:
        started.append(name)
        release.wait(60)  # blocks the loop on purpose

    hog.enqueue(name="a", job_id="a")
    hog.enqueue(name="b", job_id="b")
    q = app.queue("work")
    try:
        # When the worker stops while one handler runs and the other waits to start
        with running(app, grace_s=0.2) as worker:
            wait_until(lambda: len(worker.in_flight()) == 2 and started)
    finally:
        release.set()
    # Then the one that ran was given back counted, the other free
    assert len(started) == 1
    ran, waited = q.get(started[0]), q.get("b" if started == ["a"] else "a")
    assert ran is not None and (ran.status, ran.attempts, ran.givebacks) == ("pending", 0, 1)
    assert waited is not None and (waited.status, waited.attempts, waited.givebacks) == (
        "pending", 0, 0)
    assert events(q, waited.id)[-1] == "given_back"


def test_an_async_job_cut_off_by_the_stop_of_its_loop_is_given_back(app: leaseq.App) -> None:
    # Given an async handler that awaits for longer than the test runs
    started = threading.Event()

    @app.task(queue="work")
    async def waits(job: leaseq.Job) -> None:
        if job.attempt == 1 and job.givebacks == 0:
            started.set()
            await asyncio.sleep(60)

    waits.enqueue(job_id="w")
    q = app.queue("work")
    with running(app) as worker:
        assert started.wait(10)
        # When the handlers' loop stops under it (the worker's shutdown stops it last)
        worker._loop.stop()
        # Then the job is given back at once, not left to its lease, and runs again
        wait_until(lambda: q.get("w").status == "done",  # type: ignore[union-attr]
                   what="the job to be given back and run again", timeout_s=10)
    assert events(q, "w").count("given_back") == 1


def test_the_give_backs_of_a_stop_share_one_bound_when_the_store_does_not_answer(
    app: leaseq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given three running jobs, and a store that does not answer give-backs (each call waits
    # as long as its deadline lets it)
    monkeypatch.setattr(lifecycle, "GIVE_BACK_BOUND_S", 0.5)
    release = threading.Event()

    @app.task(queue="work")
    def long(n: int) -> None:
        release.wait(30)

    for n in range(3):
        long.enqueue(n=n, job_id=f"l{n}")
    bounds: list[float | None] = []

    def unanswered(*args: object, **kwargs: object) -> None:
        bound = deadline.remaining_s()
        bounds.append(bound)
        time.sleep(60 if bound is None else bound)
        raise StoreUnavailable("database away")

    try:
        with running(app, grace_s=0.1, concurrency=3) as worker:
            wait_until(lambda: len(worker.in_flight()) == 3)
            monkeypatch.setattr(app.store, "give_back", unanswered)
            # When the worker stops (the block's end; `running` fails if it does not return)
    finally:
        release.set()
    # Then every give-back had a deadline, all within the one bound
    assert len(bounds) == 3
    assert all(bound is not None and bound <= 0.5 for bound in bounds), bounds
