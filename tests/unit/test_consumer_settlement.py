"""How the RabbitMQ consumer settles a delivery (issue 14, docs/rabbitmq.md): never an ack
without a result. A job whose lease was lost here goes back to RabbitMQ (``nack`` with
requeue); a job the store says is held by a live lease is acked (its lease's expiry owes the
publish again); and the lease clock of a claimed job starts when the claim was sent. No broker
is needed: the consumer's handler is called directly, on a stand-in channel."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import leaseq
from leaseq.delivery.connection import Reconnect, encode
from leaseq.delivery.consumer import Consumer, ConsumerConfig, _Delivery, _Session
from leaseq.delivery.execute import AppExecutor
from leaseq.job import Job, LeaseLost


class Conn:
    def add_callback_threadsafe(self, callback: Any) -> None:
        callback()


class Channel:
    """Records what the consumer sent: ``("ack", tag)`` or ``("nack", tag, requeue)``."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    def basic_ack(self, tag: int) -> None:
        self.sent.append(("ack", tag))

    def basic_nack(self, tag: int, requeue: bool = True) -> None:
        self.sent.append(("nack", tag, requeue))


@pytest.fixture
def app(tmp_path: Path) -> Iterator[leaseq.App]:
    app = leaseq.App(f"sqlite:///{tmp_path / 'jobs.db'}")

    @app.task(queue="jobs")
    def work() -> None:
        """Nothing."""

    yield app
    app.store.close()


def handle(consumer: Consumer, job_id: str) -> Channel:
    """The consumer handles one delivery of ``job_id``; returns what it sent."""
    channel = Channel()
    session = _Session(Conn(), channel, threading.Event())  # type: ignore[arg-type]
    consumer._handle(_Delivery(session, "jobs", 7, False, 0, encode("jobs", job_id)))
    assert session.broken is None
    return channel


def acks(queue: leaseq.Queue, job_id: str) -> list[str]:
    return [e.reason or "" for e in queue.journal(job_id) if e.event == "ack_sent"]


def test_a_job_whose_lease_was_lost_here_goes_back_to_rabbitmq(app: leaseq.App) -> None:
    # Given a consumer whose run of the job ends with its lease lost (nothing written)
    def execute(job: Job) -> Job:
        raise LeaseLost(job.queue, job.id, job.lease_epoch)

    queue = app.queue("jobs")
    queue.enqueue("j", {}, task="work")
    # When it handles the job's delivery
    channel = handle(Consumer([queue], execute, "amqp://"), "j")
    # Then the delivery is nacked with requeue: not acked without a result, not quarantined
    assert channel.sent == [("nack", 7, True)]
    assert acks(queue, "j") == []
    assert queue.get("j").status == "processing"  # its lease lapses; nothing was settled


def test_a_job_held_by_a_live_lease_is_acked_as_not_claimable(app: leaseq.App) -> None:
    # Given a job another consumer holds (or this one abandoned) under a live lease
    queue = app.queue("jobs")
    queue.enqueue("j", {}, task="work")
    assert queue.claim_one("j", "another") is not None
    ran: list[str] = []
    # When its delivery comes (back)
    channel = handle(Consumer([queue], lambda job: ran.append(job.id) or job, "amqp://"), "j")
    # Then it is acked on the store's word, without running: the lease's expiry owes the
    # publish again (reclaim), so this message is not the job's last
    assert channel.sent == [("ack", 7)] and ran == []
    assert acks(queue, "j") == ["ack; not claimable: held by a live lease"]


def test_the_lease_clock_starts_when_the_claim_was_sent(app: leaseq.App) -> None:
    # Given an executor that takes the claim's send time, and a claim that takes a while
    class Executor:
        def __init__(self) -> None:
            self.sent_at: float | None = None

        def __call__(self, job: Job) -> Job:
            raise AssertionError("run_claimed is the one to call")

        def run_claimed(self, job: Job, sent_at: float) -> Job:
            self.sent_at = sent_at
            return job

    queue = app.queue("jobs")
    queue.enqueue("j", {}, task="work")
    claim_one = app.store.claim_one
    entered: list[float] = []

    def slow_claim(*args: Any, **kwargs: Any) -> Job | None:
        entered.append(time.monotonic())
        time.sleep(0.05)  # the claim's round trip: what the lease clock must not forget
        return claim_one(*args, **kwargs)

    app.store.claim_one = slow_claim  # type: ignore[method-assign]
    executor = Executor()
    # When the consumer claims and runs the job
    handle(Consumer([queue], executor, "amqp://"), "j")
    # Then the executor was told when the claim left, not when its answer came back
    assert executor.sent_at is not None and entered
    assert executor.sent_at <= entered[0]


def test_a_stop_gives_a_started_job_back_under_its_tasks_max_givebacks(
        tmp_path: Path) -> None:
    # Given a queue that allows 3 free give-backs, and a task on it that allows none
    app = leaseq.App(f"sqlite:///{tmp_path / 'jobs.db'}", queues={"jobs": {"max_givebacks": 3}})

    @app.task(queue="jobs", max_givebacks=0)
    def strict() -> None:
        """Nothing."""

    executor = AppExecutor(app)
    try:
        queue = app.queue("jobs")
        queue.enqueue("j", {}, task="strict")
        job = queue.claim_one("j", "consumer-1")
        assert job is not None and job.attempts == 1
        # When the consumer's stop gives the job back while its handler runs
        Consumer([queue], executor, "amqp://")._give_back("jobs", job, started=True)
        # Then the task's bound applies: the attempt is spent, not refunded as the queue's
        # bound would have it
        after = queue.get("j")
        assert (after.status, after.attempts) == ("pending", 1)
    finally:
        executor.close()
        app.store.close()


def test_a_stop_during_a_reconnect_gives_back_what_the_dropped_session_left_running(
        app: leaseq.App) -> None:
    # Given a handler that holds its job until released
    started, release = threading.Event(), threading.Event()

    def execute(job: Job) -> Job:
        started.set()
        release.wait(10)
        return job

    queue = app.queue("jobs")
    queue.enqueue("j", {}, task="work")
    consumer = Consumer([queue], execute, "amqp://", config=ConsumerConfig(grace_s=0.2))
    stop = threading.Event()

    # and a session that took the job's delivery, then dropped while the handler ran, the
    # stop arriving during the reconnect's backoff
    def session(pool: Any, _stop: threading.Event) -> None:
        state = _Session(Conn(), Channel(), threading.Event())  # type: ignore[arg-type]
        pool.submit(consumer._handle, _Delivery(state, "jobs", 7, False, 0, encode("jobs", "j")))
        assert started.wait(10)
        state.closed.set()
        stop.set()
        raise Reconnect("the connection dropped")

    consumer._session = session  # type: ignore[method-assign]
    try:
        # When the consumer runs to its stop
        consumer.run(stop)
        # Then the job the dropped session left running was given back after the grace
        # instead of being left to its lease
        after = queue.get("j")
        assert after.status == "pending"
        assert [e.event for e in queue.journal("j")][-1] == "given_back"
    finally:
        release.set()
