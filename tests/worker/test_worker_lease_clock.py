"""The local lease clock (issue 14, DESIGN.md §8): a worker cut off from its store stops
trusting a lease at ``sent + lease_s - margin`` of the request that last confirmed it, before
the store can hand the job to anyone else, whatever the network does.

The partition is made by the store itself: every heartbeat (and journal write) fails, or hangs
past the beat's bound, while the handlers keep running.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from worker_helpers import running, wait_until

import leaseq
from leaseq import deadline
from leaseq.errors import InvalidInput, StoreUnavailable
from leaseq.job import LeaseLost
from leaseq.worker import ABANDONED_EVENT, WorkerConfig

LEASE_S = 1.5
BEAT_S = 0.3


class Partition:
    """Cuts the store's heartbeats and journal writes off while ``cut`` is set; ``hang``
    makes a cut call wait for its caller's deadline instead of failing at once.
    ``longest_beat_bound_s``: the longest time a cut heartbeat was given by its caller's
    deadline (infinite for one without)."""

    def __init__(self, store: Any, hang: bool = False):
        self.cut = threading.Event()
        self.hang = hang
        self.longest_beat_bound_s = 0.0
        for name in ("heartbeat_many", "append_journal"):
            setattr(store, name, self._guard(getattr(store, name), name == "heartbeat_many"))

    def _guard(self, call: Any, beat: bool) -> Any:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if self.cut.is_set():
                bound = deadline.remaining_s()
                if beat:
                    self.longest_beat_bound_s = max(self.longest_beat_bound_s,
                                                    float("inf") if bound is None else bound)
                if self.hang:  # a black hole: nothing comes back before the deadline
                    time.sleep(bound or 60.0)
                raise StoreUnavailable("network unreachable")
            return call(*args, **kwargs)
        return guarded


def _app(url: str) -> leaseq.App:
    return leaseq.App(url, queues={"work": {"lease_s": LEASE_S, "heartbeat_every_s": BEAT_S}})


def _app_counting_runs(url: str) -> tuple[leaseq.App, Any, list[int]]:
    """``_app`` with a task ``once`` that returns at once, and the attempt of each of its
    runs."""
    app = _app(url)
    runs: list[int] = []

    @app.task(queue="work")
    def once(job: leaseq.Job) -> str:
        runs.append(job.attempts)
        return "ran"

    return app, once, runs


def _store_view(app: leaseq.App, job_id: str) -> tuple[Any, Any]:
    """The store's time and the job's record, read as a handler sees its lease lost (reads
    the partition leaves alone)."""
    return app.store.server_now(), app.queue("work").get(job_id)


def _before_the_store_lease_ended(view: tuple[Any, Any]) -> bool:
    """Whether the store still held the job's first lease when its handler saw it lost: no
    other worker could have claimed it yet. (The guarantee itself: how long the handler
    took in wall time is for a busy machine to stretch.)"""
    now, job = view
    return job.lease_epoch == 1 and job.status == "processing" and now < job.lease_until


def _check_until_lost(app: leaseq.App, job: leaseq.Job, stamps: dict[str, float],
                      views: dict[str, tuple[Any, Any]]) -> None:
    """A long sync handler done right: checks its lease every 10 ms until it is lost, then
    stamps when (``stamps["lost"]``) and what the store held at that moment (``views``)."""
    stamps["started"] = time.monotonic()
    try:
        while True:
            job.check()
            time.sleep(0.01)
    except LeaseLost:
        stamps["lost"] = time.monotonic()
        views["lost"] = _store_view(app, job.id)
        raise


@pytest.mark.parametrize("hang", [False, True], ids=["refused", "black-hole"])
def test_a_cut_off_worker_abandons_its_job_before_the_lease_runs_out(url: str,
                                                                      hang: bool) -> None:
    # Given a long sync handler that checks its lease between steps
    app = _app(url)
    stamps: dict[str, float] = {}
    views: dict[str, tuple[Any, Any]] = {}

    @app.task(queue="work")
    def long(job: leaseq.Job) -> str:
        if job.attempts > 1:
            return "second run"
        _check_until_lost(app, job, stamps, views)
        return "never"

    @app.task(queue="work")
    def quick() -> str:
        return "ok"

    partition = Partition(app.store, hang=hang)
    q = app.queue("work")
    job_id = long.enqueue().job_id
    with running(app, concurrency=1, lease_margin_s=0.5) as worker:
        wait_until(lambda: "started" in stamps, what="the handler started")
        # When the worker is cut off from its store (beats fail or hang)
        partition.cut.set()
        wait_until(lambda: "lost" in views, "the handler saw its lease lost", timeout_s=5)
        # Then the handler saw it before the store's lease ran out (its clock runs out at
        # lease - margin after the last beat sent)
        assert _before_the_store_lease_ended(views["lost"]), views["lost"]
        # And every beat was bounded by its deadline: half the interval (the bound the beat
        # gave the store, not the wall time, which a busy machine stretches)
        assert partition.longest_beat_bound_s <= BEAT_S / 2
        # And its one slot is free: another job runs while the partition lasts
        other = quick.enqueue().job_id
        wait_until(lambda: q.get(other).status == "done", "the next job ran", timeout_s=5)
        # And nothing of the abandoned attempt was written; it waits to be journaled
        assert worker.abandoned_pending() == 1
        assert ABANDONED_EVENT not in [e.event for e in q.journal(job_id)]
        # When the store answers again
        partition.cut.clear()
        # Then the worker journals what it abandoned, and the job runs again after its lease
        wait_until(lambda: worker.abandoned_pending() == 0,
                   "the abandonment journaled", timeout_s=5)
        entry = [e for e in q.journal(job_id) if e.event == ABANDONED_EVENT]
        assert len(entry) == 1 and entry[0].attempt == 1 and "not confirmed" in entry[0].reason
        wait_until(lambda: q.get(job_id).status == "done",
                   "the job ran again and ended", timeout_s=10)
        assert q.get(job_id).attempts == 2


def test_an_async_handler_is_cancelled_when_its_lease_clock_runs_out(url: str) -> None:
    app = _app(url)
    seen: dict[str, Any] = {}

    @app.task(queue="work")
    async def waits(job: leaseq.Job) -> str:
        seen["started"] = time.monotonic()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen["cancelled"] = _store_view(app, job.id)
            raise
        return "never"

    partition = Partition(app.store)
    job_id = waits.enqueue().job_id
    with running(app, concurrency=1, lease_margin_s=0.5):
        wait_until(lambda: "started" in seen, what="the handler started")
        partition.cut.set()
        wait_until(lambda: "cancelled" in seen, "the async handler was cancelled", timeout_s=5)
        # before the store's lease ran out, and nothing was written
        assert _before_the_store_lease_ended(seen["cancelled"]), seen["cancelled"]
        assert app.queue("work").get(job_id).attempts == 1


def test_beats_that_answer_keep_the_lease_clock_running(url: str) -> None:
    # Given a handler that runs for three leases with the store reachable
    app = _app(url)
    # When it runs, Then every beat moved the clock on: nothing was abandoned
    _run_unabandoned(app, 3 * LEASE_S)


def test_a_beat_interval_too_long_for_the_lease_clock_is_shortened(
        url: str, caplog: pytest.LogCaptureFixture) -> None:
    # Given a queue beaten every 1.4 s of a 1.5 s lease: valid, but the lease clock (lease
    # minus the 0.5 s margin) trusts a beat for 1 s only
    app = leaseq.App(url, queues={"work": {"lease_s": LEASE_S, "heartbeat_every_s": 1.4}})
    # When a handler runs for two leases, Then it was beaten often enough (every 0.5 s) that
    # nothing was abandoned
    with caplog.at_level("WARNING", logger="leaseq.heartbeat"):
        _run_unabandoned(app, 2 * LEASE_S)
    # And the worker said once that it beats more often than configured
    said = [r for r in caplog.records if getattr(r, "action", None) == "heartbeat_every"]
    assert len(said) == 1 and "every 0.5 s" in said[0].getMessage()


@pytest.mark.parametrize("field, value", [("lease_margin_s", -1), ("beat_timeout_s", 0),
                                          ("beat_timeout_s", "1")])
def test_lease_clock_options_are_checked(field: str, value: object) -> None:
    with pytest.raises(InvalidInput, match=field):
        WorkerConfig(**{field: value})


def test_job_check_raises_once_the_lease_is_lost() -> None:
    job = leaseq.Job(id="j", queue="q", status="processing", payload={}, lease_epoch=3)
    job.check()  # held: nothing happens
    job.lease_lost = True
    with pytest.raises(LeaseLost):
        job.check()


def test_a_claim_answered_after_its_lease_clock_ran_out_never_starts(url: str) -> None:
    # Given a store whose first claim answers 1.2 s late (the lease clock allows 1 s)
    app, once, runs = _app_counting_runs(url)
    claim = app.store.claim
    slow = threading.Event()

    def late_claim(*args: Any, **kwargs: Any) -> Any:
        jobs = claim(*args, **kwargs)
        if jobs and not slow.is_set():
            slow.set()
            time.sleep(LEASE_S - 0.5 + 0.2)
        return jobs

    app.store.claim = late_claim  # type: ignore[method-assign]
    job_id = once.enqueue().job_id
    q = app.queue("work")
    with running(app, concurrency=1, lease_margin_s=0.5, sweep_every_s=0.2) as worker:
        # Then the late job is abandoned unstarted, journaled, and runs once, as attempt 2
        wait_until(lambda: q.get(job_id).status == "done",
                   "the job ran after its lease", timeout_s=10)
        wait_until(lambda: worker.abandoned_pending() == 0,
                   "the abandonment journaled", timeout_s=5)
    assert runs == [2]
    assert [e.attempt for e in q.journal(job_id) if e.event == ABANDONED_EVENT] == [1]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_consumer_cut_off_from_its_store_abandons_the_delivered_job(url: str,
                                                                      kind: str) -> None:
    # Given the broker consumer's executor running a claimed job whose handler checks its
    # lease, and a task that just returns; a lease of 3 s whose clock runs out 1 s early (the
    # margin that absorbs a late wake-up of the heartbeat thread on a busy machine)
    from leaseq.delivery.execute import AppExecutor

    lease_s, margin_s = 3.0, 1.0
    app = leaseq.App(url, queues={"work": {"lease_s": lease_s, "heartbeat_every_s": BEAT_S}})
    seen: dict[str, float] = {}
    views: dict[str, tuple[Any, Any]] = {}

    @app.task(queue="work", name="sync_job")
    def sync_job(job: leaseq.Job) -> str:
        _check_until_lost(app, job, seen, views)
        return "never"

    @app.task(queue="work", name="async_job")
    async def async_job(job: leaseq.Job) -> str:
        seen["started"] = time.monotonic()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen["lost"] = time.monotonic()
            views["lost"] = _store_view(app, job.id)
            raise
        return "never"

    @app.task(queue="work", name="once")
    def once() -> str:
        return "ran"

    task = sync_job if kind == "sync" else async_job
    q = app.queue("work")
    job_id = task.enqueue().job_id
    sent_at = time.monotonic()
    job = q.claim_one(job_id, "consumer-1")
    assert job is not None
    partition = Partition(app.store)
    executor = AppExecutor(app, lease_margin_s=margin_s)
    try:
        partition.cut.set()  # When the consumer loses its store (RabbitMQ still answers)
        # Then the call ends with LeaseLost, having written nothing: the consumer requeues the
        # delivery (tests/rabbitmq)
        with pytest.raises(LeaseLost):
            executor.run_claimed(job, sent_at)
        # And the handler lost its lease once lease - margin had passed since the claim was
        # sent, and before the store's lease ran out (when another consumer could claim it);
        # an async one is cancelled on the executor's loop, as the call returns
        wait_until(lambda: "lost" in views, "the handler saw its lease lost", timeout_s=5)
        assert lease_s - margin_s <= seen["lost"] - sent_at
        assert _before_the_store_lease_ended(views["lost"]), views["lost"]
        assert q.get(job_id).status == "processing"
        # And the abandonment waits to be journaled while the store is cut off
        assert executor.abandoned_pending() == 1
        # When the store answers again and the consumer runs its next delivered job
        partition.cut.clear()
        next_id = once.enqueue().job_id
        sent_at = time.monotonic()
        executor.run_claimed(q.claim_one(next_id, "consumer-1"), sent_at)  # type: ignore[arg-type]
        # Then the abandonment is journaled first, naming the consumer, as the worker does
        assert executor.abandoned_pending() == 0
        (entry,) = [e for e in q.journal(job_id) if e.event == ABANDONED_EVENT]
        assert entry.worker_id == "consumer-1" and entry.attempt == 1
        assert (entry.reason or "").startswith("lease not confirmed for")
        assert q.get(next_id).status == "done"
    finally:
        executor.close()


def test_a_consumer_whose_claim_answered_too_late_never_starts_the_job(url: str) -> None:
    # Given a job the consumer claimed with a request sent longer ago than lease - margin
    from leaseq.delivery.execute import AppExecutor

    app, once, runs = _app_counting_runs(url)
    q = app.queue("work")
    job_id = once.enqueue().job_id
    job = q.claim_one(job_id, "consumer-1")
    assert job is not None
    executor = AppExecutor(app, lease_margin_s=0.5)
    try:
        # When the executor is told when that claim was sent
        sent_at = time.monotonic() - (LEASE_S - 0.5) - 0.01
        # Then its lease clock has already run out: LeaseLost at once, the handler never ran
        with pytest.raises(LeaseLost):
            executor.run_claimed(job, sent_at)
        assert runs == [] and q.get(job_id).status == "processing"
    finally:
        executor.close()


def _stubborn_app(url: str) -> tuple[leaseq.App, Any, threading.Event, threading.Event]:
    """``_app`` with a sync task that never looks at its lease: it runs until ``release``
    is set. Returns the app, the task, ``started`` and ``release``."""
    app = _app(url)
    started, release = threading.Event(), threading.Event()

    @app.task(queue="work")
    def stubborn() -> str:
        started.set()
        release.wait(30)  # deaf to its lease on purpose
        return "late"

    return app, stubborn, started, release


def test_a_handler_its_lease_clock_abandoned_still_holds_up_a_normal_exit(url: str) -> None:
    # Given a worker whose lease clock abandoned a handler that runs on regardless
    app, stubborn, started, release = _stubborn_app(url)
    partition = Partition(app.store)
    stubborn.enqueue()
    try:
        with running(app, concurrency=1, lease_margin_s=0.5, grace_s=0.1) as worker:
            assert started.wait(10)
            partition.cut.set()
            wait_until(lambda: worker.abandoned_pending() == 1, "the job abandoned",
                       timeout_s=5)
            assert worker.in_flight() == []  # it left the jobs in flight
        # When the worker has returned
        # Then its pool thread still runs the handler: a straggler (the process must use
        # os._exit, or a normal exit waits for it)
        assert worker.has_stragglers()
    finally:
        release.set()
    wait_until(lambda: not worker.has_stragglers(), "the handler to return", timeout_s=10)


def test_an_abandon_that_raises_does_not_stop_the_heartbeat(url: str) -> None:
    # Given a worker whose first abandon fails (the lease clock's hook raises once)
    app, stubborn, started, release = _stubborn_app(url)
    partition = Partition(app.store)
    stubborn.enqueue()
    raised: list[str] = []
    try:
        with running(app, concurrency=1, lease_margin_s=0.5, grace_s=0.1) as worker:
            abandon = worker._heartbeat.on_untrusted

            def fails_once(item: Any) -> bool:
                if not raised:
                    raised.append(item.job.id)
                    raise RuntimeError("the event loop's thread could not start")
                return abandon(item)

            worker._heartbeat.on_untrusted = fails_once
            assert started.wait(10)
            # When its lease clock runs out
            partition.cut.set()
            # Then the heartbeat thread lives on and abandons the job on its next look
            wait_until(lambda: worker.abandoned_pending() == 1, "the job abandoned",
                       timeout_s=5)
            assert raised and worker._heartbeat._thread.is_alive()
    finally:
        release.set()


def test_a_slot_whose_thread_an_abandoned_handler_holds_takes_no_job(url: str) -> None:
    # Given one slot (two pool threads), two handlers deaf to their lease and a quick job
    app, stubborn, started, release = _stubborn_app(url)

    @app.task(queue="work")
    def quick() -> str:
        return "ok"

    partition = Partition(app.store)
    first, second = stubborn.enqueue().job_id, stubborn.enqueue().job_id
    q = app.queue("work")
    try:
        with running(app, concurrency=1, lease_margin_s=0.5, idle_max_s=0.05) as worker:
            assert started.wait(10)
            # When the store is cut off long enough for the lease clock to abandon both, one
            # after the other: each keeps its pool thread
            partition.cut.set()
            wait_until(lambda: worker.abandoned_pending() == 2, "both abandoned", timeout_s=10)
            assert {q.get(first).attempts, q.get(second).attempts} == {1}  # type: ignore[union-attr]
            partition.cut.clear()
            looks = _count_calls(worker, "_room")
            job_id = quick.enqueue().job_id
            # Then the worker has no slot to offer: a job claimed now would wait in the pool's
            # queue, under lease and heartbeat, for as long as those handlers run. It looks
            # for room a few times after the enqueue (every idle_max_s) and takes nothing
            seen = len(looks)
            wait_until(lambda: len(looks) >= seen + 5, "the worker to look for room 5 times")
            assert max(looks[seen:]) <= 0
            assert q.get(job_id).status == "pending"  # type: ignore[union-attr]
            # And once one of them returns, its thread runs the job
            release.set()
            wait_until(lambda: q.get(job_id).status == "done", "the quick job ran",  # type: ignore[union-attr]
                       timeout_s=10)
    finally:
        release.set()


def _count_calls(worker: Any, name: str) -> list[Any]:
    """Wraps ``worker.<name>`` so that each call's answer is appended to the list returned."""
    answers: list[Any] = []
    call = getattr(worker, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        answer = call(*args, **kwargs)
        answers.append(answer)
        return answer
    setattr(worker, name, counted)
    return answers


def _run_unabandoned(app: leaseq.App, seconds: float) -> None:
    """Run one handler that checks its lease for ``seconds``; assert it ended done with
    nothing abandoned."""

    @app.task(queue="work")
    def steady(job: leaseq.Job) -> str:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            job.check()
            time.sleep(0.01)
        return "done"

    job_id = steady.enqueue().job_id
    with running(app, concurrency=1, lease_margin_s=0.5) as worker:
        wait_until(lambda: app.queue("work").get(job_id).status == "done", "done", timeout_s=15)
        assert worker.abandoned_pending() == 0
    assert ABANDONED_EVENT not in [e.event for e in app.queue("work").journal(job_id)]
