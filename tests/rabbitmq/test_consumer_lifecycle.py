"""The consumer's own life against the real local RabbitMQ: a consumer the broker cancels comes
back, a stop keeps to its grace period and starts nothing new, and a message whose job id no
store would take is quarantined instead of dropping the connection.

Each consumer runs in a thread of the test, over the test's own SQLite file and vhost; every
wait is bounded and waits for an event, a journal line or a queue's count, never for time."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import unquote, urlsplit

import pika
import pytest
from rabbit_harness import Harness, rabbitmqctl, wait_for

import leaseq
from leaseq.browse import WorkerInfo
from leaseq.delivery.connection import encode
from leaseq.delivery.execute import AppExecutor
from leaseq.delivery.quarantine import peek
from leaseq.delivery.rabbitmq import Consumer, ConsumerConfig, Topology

pytestmark = pytest.mark.rabbitmq

TOPOLOGY = Topology()


class Gate:
    """The handlers' runs: each notes its job and waits for ``release`` (bounded)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.first_started = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def run(self, job: leaseq.Job) -> str:
        with self._lock:
            self.started.append(job.id)
        self.first_started.set()
        self.release.wait(30)
        return "done"


def gated_app(store: leaseq.Store, gate: Gate, queues: tuple[str, ...]) -> leaseq.App:
    app = leaseq.App(store=store, queues={name: {} for name in queues})
    for name in queues:
        app.task(queue=name, name=f"hold-{name}")(gate.run)
    return app


@contextmanager
def consumer_thread(consumer: Consumer, stop: threading.Event) -> Iterator[threading.Thread]:
    thread = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()


def publish(amqp_url: str, queue: str, body: bytes) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        conn.channel().basic_publish(TOPOLOGY.exchange, queue, body)
    finally:
        conn.close()


def queue_state(amqp_url: str, name: str) -> tuple[int, int]:
    """``(ready messages, consumers)`` of queue ``name``; (-1, -1) while it does not exist."""
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        declared = conn.channel().queue_declare(name, passive=True).method
        return declared.message_count, declared.consumer_count
    except pika.exceptions.ChannelClosedByBroker:
        return -1, -1
    finally:
        if conn.is_open:
            conn.close()


def consumer_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("leaseq-consumer")}


@contextmanager
def gated_consumer(harness: Harness, gate: Gate, queues: tuple[str, ...],
                   config: ConsumerConfig) -> Iterator[tuple[leaseq.App, Consumer]]:
    """A consumer of ``queues`` running ``gated_app``'s tasks on a store of its own; at the
    end the gate is opened (no handler stays held) and the executor and store are closed."""
    store = leaseq.connect(harness.store_url)
    app = gated_app(store, gate, queues)
    executor = AppExecutor(app)
    try:
        yield app, Consumer([app.queue(q) for q in queues], executor, harness.amqp_url,
                            topology=TOPOLOGY, config=config)
    finally:
        gate.release.set()
        executor.close()
        store.close()


# --- a consumer the broker cancels ----------------------------------------------------------


def test_a_consumer_the_broker_cancels_reconnects_and_takes_work_again(
        harness: Harness) -> None:
    gate = Gate()
    gate.release.set()  # every run finishes at once
    work_queue = TOPOLOGY.work_queue("jobs")
    with gated_consumer(harness, gate, ("jobs",), ConsumerConfig(
            concurrency=1, grace_s=1, max_backoff_s=0.5)) as (app, consumer):
        with consumer_thread(consumer, threading.Event()) as thread:
            # Given a consumer consuming the work queue
            wait_for("the consumer consuming",
                     lambda: queue_state(harness.amqp_url, work_queue)[1] == 1, 30, harness)
            # When RabbitMQ cancels it: its queue deleted. (Not declared again by the test: a
            # quorum queue declared again at once can keep the old consumer attached without
            # a cancel; the consumer's own next session declares it.)
            conn = pika.BlockingConnection(pika.URLParameters(harness.amqp_url))
            conn.channel().queue_delete(work_queue)
            conn.close()
            wait_for("the consumer back on its declared queue",
                     lambda: queue_state(harness.amqp_url, work_queue)[1] == 1, 30, harness)
            # and a job is enqueued and published
            app.queue("jobs").enqueue("after-cancel", {}, task="hold-jobs")
            publish(harness.amqp_url, "jobs", encode("jobs", "after-cancel"))
            # Then the consumer came back by itself and ran it
            wait_for("the job done",
                     lambda: app.queue("jobs").get("after-cancel").status == "done", 30,
                     harness)
        thread.join(timeout=10)
        assert not thread.is_alive(), "the consumer did not stop"
        assert gate.started == ["after-cancel"]


# --- the worker registry -----------------------------------------------------------------


def test_a_consumer_is_in_the_worker_registry_while_it_runs(harness: Harness) -> None:
    # Given a consumer of two queues
    gate = Gate()
    gate.release.set()
    with gated_consumer(harness, gate, ("jobs", "mail"), ConsumerConfig(
            concurrency=1, grace_s=1, max_backoff_s=0.5)) as (app, consumer):
        store = app.store

        def registered() -> list[WorkerInfo]:
            return [w for w in store.list_workers() if w.worker_id == consumer.worker_id]

        stop = threading.Event()
        with consumer_thread(consumer, stop) as thread:
            # When it runs, Then the registry holds it with its queues, as a polling worker
            # (the dashboard's workers page, and leaseq doctor's "ready and no live worker")
            wait_for("the consumer registered", lambda: bool(registered()), 30, harness)
            (info,) = registered()
            assert sorted(info.queues) == ["jobs", "mail"]
            stop.set()
            thread.join(timeout=10)
        assert not thread.is_alive(), "the consumer did not stop"
        # And once it stopped cleanly, it is forgotten
        assert registered() == []


# --- stop: the grace period, and nothing new starts -----------------------------------------

GRACE_S = 0.5
#: What run() may take past the grace: the pump's last turn (0.2 s), giving back one job,
#: closing the connection.
STOP_BOUND_S = 3.0


def test_stop_keeps_to_the_grace_gives_back_what_runs_and_starts_nothing_queued(
        harness: Harness) -> None:
    gate = Gate()
    queues = {"jobs": TOPOLOGY.work_queue("jobs"), "other": TOPOLOGY.work_queue("other")}
    before = consumer_threads()
    stop = threading.Event()
    # One handler thread, and a prefetch of one per queue: two deliveries, one of them waits
    # in the consumer for the thread the other holds.
    with gated_consumer(harness, gate, ("jobs", "other"), ConsumerConfig(
            concurrency=1, grace_s=GRACE_S)) as (app, consumer):
        with consumer_thread(consumer, stop) as thread:
            # Given one job per queue, both delivered to the consumer, one of them running
            for name in queues:
                app.queue(name).enqueue(f"{name}-job", {}, task=f"hold-{name}")
            wait_for("the consumer consuming both queues", lambda: all(
                queue_state(harness.amqp_url, q)[1] == 1 for q in queues.values()), 30, harness)
            for name in queues:
                publish(harness.amqp_url, name, encode(name, f"{name}-job"))
            wait_for("one handler running", gate.first_started.is_set, 30, harness)
            wait_for("both messages delivered", lambda: all(
                queue_state(harness.amqp_url, q)[0] == 0 for q in queues.values()), 30, harness)
            (running,) = gate.started
            waiting = next(f"{n}-job" for n in queues if f"{n}-job" != running)
            # When the consumer is stopped while the running handler holds on
            stopped_at = time.monotonic()
            stop.set()
            thread.join(timeout=GRACE_S + STOP_BOUND_S)
            # Then run() returned within the grace period and a small fixed bound
            assert not thread.is_alive(), "run() outlived its grace period"
            assert time.monotonic() - stopped_at < GRACE_S + STOP_BOUND_S
        # And the running job was given back, ready at once, its message returned
        queue_of = {f"{n}-job": app.queue(n) for n in queues}
        assert queue_of[running].get(running).status == "pending"
        assert "given_back" in [e.event for e in queue_of[running].journal(running)]
        # And the waiting delivery never claimed its job, and its message went back too
        assert "claimed" not in [e.event for e in queue_of[waiting].journal(waiting)]
        wait_for("both messages back in their queues", lambda: all(
            queue_state(harness.amqp_url, q)[0] == 1 for q in queues.values()), 10, harness)
        # And once the held handler lets go, its result is not written, and nothing else runs
        gate.release.set()
        wait_for("the consumer's threads gone", lambda: not consumer_threads() - before, 10,
                 harness)
        assert gate.started == [running]
        assert queue_of[running].get(running).status == "pending"
        assert queue_of[waiting].get(waiting).attempts == 0


# --- a message whose job id no store would take ---------------------------------------------

BAD_IDS = {"nul": "bad\x00id", "lone surrogate": "bad\ud800id", "too long": "x" * 5000}


def test_a_message_with_an_invalid_job_id_is_quarantined_without_a_reconnect(
        harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    gate = Gate()
    gate.release.set()
    quarantine = TOPOLOGY.quarantine_queue("jobs")
    caplog.set_level(logging.INFO, logger="leaseq")
    with gated_consumer(harness, gate, ("jobs",), ConsumerConfig(
            concurrency=2, grace_s=1, max_backoff_s=0.5)) as (app, consumer):
        with consumer_thread(consumer, threading.Event()) as thread:
            # Given a consumer, and messages whose job id fails validation
            wait_for("the consumer consuming", lambda: queue_state(
                harness.amqp_url, TOPOLOGY.work_queue("jobs"))[1] == 1, 30, harness)
            for bad in BAD_IDS.values():
                publish(harness.amqp_url, "jobs", encode("jobs", bad))
            # When they are delivered / Then each is quarantined (rejected, dead-lettered)
            wait_for("the malformed messages quarantined", lambda: queue_state(
                harness.amqp_url, quarantine)[0] == len(BAD_IDS), 30, harness)
            # And the consumer kept its connection, and takes good work on it
            app.queue("jobs").enqueue("good", {}, task="hold-jobs")
            publish(harness.amqp_url, "jobs", encode("jobs", "good"))
            wait_for("the good job done",
                     lambda: app.queue("jobs").get("good").status == "done", 30, harness)
        thread.join(timeout=10)
        messages = [r.getMessage() for r in caplog.records]
        assert not [m for m in messages if "session lost" in m], messages
        assert len([r for r in caplog.records
                    if getattr(r, "action", None) == "malformed_message"]) == len(BAD_IDS)
        # And no log line echoes a raw id
        for bad in BAD_IDS.values():
            assert not [m for m in messages if bad in m or bad[:40] in m]


# --- a handler that outlives its delivery's session, then fails ------------------------------


def close_consumer_connections(amqp_url: str) -> int:
    """Have RabbitMQ close every leaseq consumer connection of the URL's vhost (as a broker
    restart or a network blip would end it); returns how many it closed."""
    vhost = unquote(urlsplit(amqp_url).path[1:])
    listed = rabbitmqctl("list_connections", "-p", vhost, "--no-table-headers", "--quiet",
                         "pid", "client_properties")
    pids = [line.split("\t")[0] for line in listed.splitlines() if "leaseq-consumer" in line]
    for pid in pids:
        rabbitmqctl("close_connection", pid, "test: the consumer's connection drops")
    return len(pids)


def test_a_job_failing_after_its_session_dropped_still_reaches_the_quarantine_queue(
        harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    started, release = threading.Event(), threading.Event()
    caplog.set_level(logging.INFO, logger="leaseq")
    store = leaseq.connect(harness.store_url)
    app = leaseq.App(store=store, queues={"jobs": {}})

    @app.task(queue="jobs", name="poison")
    def poison(job: leaseq.Job) -> None:
        started.set()
        release.wait(30)
        raise leaseq.Permanent("poison")

    executor = AppExecutor(app)
    queue = app.queue("jobs")
    consumer = Consumer([queue], executor, harness.amqp_url, topology=TOPOLOGY,
                        config=ConsumerConfig(concurrency=2, grace_s=5, max_backoff_s=0.5))

    def redelivery_decided() -> bool:
        """The redelivery was held (this consumer) or acked as not claimable (before)."""
        held = any(getattr(r, "action", None) == "redelivery_held" for r in caplog.records)
        journal = queue.journal("poison")
        redelivered = [i for i, e in enumerate(journal)
                       if e.event == "received" and e.data.get("redelivered")]
        return held or (bool(redelivered) and any(
            e.event == "ack_sent" for e in journal[redelivered[0]:]))

    try:
        with consumer_thread(consumer, threading.Event()) as thread:
            # Given a consumer (two handler threads) whose handler of a poison job is blocked
            wait_for("the consumer consuming", lambda: queue_state(
                harness.amqp_url, TOPOLOGY.work_queue("jobs"))[1] == 1, 30, harness)
            queue.enqueue("poison", {}, task="poison")
            publish(harness.amqp_url, "jobs", encode("jobs", "poison"))
            wait_for("the handler running", started.is_set, 30, harness)
            # When RabbitMQ closes the consumer's connection while the handler runs, and the
            # redelivery reaches the consumer's next session while the job's lease is live
            assert close_consumer_connections(harness.amqp_url) == 1
            wait_for("the redelivery decided", redelivery_decided, 30, harness)
            # and then the handler raises Permanent
            release.set()
            wait_for("the job failed", lambda: queue.get("poison").status == "failed", 30,
                     harness)
            # Then the quarantine queue holds the job's message, dead-lettered as rejected
            wait_for("the message in the quarantine", lambda: queue_state(
                harness.amqp_url, TOPOLOGY.quarantine_queue("jobs"))[0] == 1, 30, harness)
            (count, (message,)) = peek(harness.amqp_url, TOPOLOGY, "jobs", 10)
            assert (count, message["job_id"], message["reason"]) == (1, "poison", "rejected")
            # And the job ran once: one claim, two deliveries, the redelivery nacked
            failed = queue.get("poison")
            assert (failed.failure, failed.attempts) == ("permanent", 1)
            names = [e.event for e in queue.journal("poison")]
            assert names.count("claimed") == 1 and names.count("received") == 2, names
            (ack,) = [e for e in queue.journal("poison") if e.event == "ack_sent"]
            assert ack.reason.startswith("nack requeue=false") and "held" in ack.reason
            assert queue_state(harness.amqp_url, TOPOLOGY.work_queue("jobs")) == (0, 1)
        thread.join(timeout=10)
        assert not thread.is_alive(), "the consumer did not stop"
    finally:
        release.set()
        executor.close()
        store.close()
