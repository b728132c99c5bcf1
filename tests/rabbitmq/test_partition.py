"""Partitions of the broker path (issue 14), in both directions.

A consumer cut off from RabbitMQ but not from its store: its connection goes through a proxy
the test turns into a black hole (bytes swallowed both ways, nothing closed or reset), while its
jobs run and their results are written. No job is lost and no delivery is acked before its
result: RabbitMQ, hearing nothing, returns the unacked deliveries; another consumer's claim
finds those jobs done and acks them without a second effect; the cut-off consumer notices
within its heartbeat bound and reconnects by itself once the link is back.

A consumer cut off from its store but not from RabbitMQ: every store call of that consumer
fails while the test says so. Its lease clock abandons the running job, and the delivery goes
back to RabbitMQ instead of being acked without a result; the job is then run to done once, by
another consumer or by the same one once its store is back, and nothing reaches the
quarantine."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pika
import pytest
from rabbit_harness import Harness, story, wait_for
from test_delivery import all_done, enqueue

import leaseq
from leaseq.delivery.execute import AppExecutor
from leaseq.delivery.rabbitmq import (
    Consumer,
    ConsumerConfig,
    Dispatcher,
    DispatcherConfig,
    Topology,
)
from leaseq.errors import StoreUnavailable
from leaseq.job import LeaseLost
from tcp_proxy import BlackHoleProxy

pytestmark = pytest.mark.rabbitmq

#: The cut-off consumer's AMQP heartbeat: it and RabbitMQ notice the silence within two.
HEARTBEAT_S = 2


def _through(proxy: BlackHoleProxy, amqp_url: str) -> str:
    parts = urlsplit(amqp_url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{proxy.port}"
    netloc_new = f"{netloc[0]}@{host}" if len(netloc) == 2 else host
    return urlunsplit((parts.scheme, netloc_new, parts.path, f"heartbeat={HEARTBEAT_S}", ""))


def test_a_consumer_black_holed_from_the_broker_loses_no_job_and_never_acks_early(
        harness: Harness) -> None:
    parts = urlsplit(harness.amqp_url)
    proxy = BlackHoleProxy((parts.hostname or "127.0.0.1", parts.port or 5672))
    try:
        # Given jobs, a dispatcher, and consumer A whose only way to RabbitMQ is the proxy
        ids = enqueue(harness, 40, sleep_s=0.3)
        direct_url = harness.amqp_url
        harness.amqp_url = _through(proxy, direct_url)
        harness.start("consume", "--concurrency", "4")
        harness.amqp_url = direct_url
        harness.start("dispatch")
        queue = harness.queue()
        wait_for("A at work", lambda: queue.counts().get("done", 0) >= 4, 30, harness)
        # When A's link to RabbitMQ goes silent (its store still answers) while B joins
        proxy.hole.set()
        cut_at, before = time.monotonic(), proxy.accepted
        harness.start("consume", "--concurrency", "4")
        wait_for("every job done while A is cut off", lambda: all_done(harness, 40), 60,
                 harness)
        time.sleep(max(cut_at + 4 * HEARTBEAT_S - time.monotonic(), 0))  # past detection
        proxy.hole.clear()
        # Then A reconnects by itself once the link is back
        wait_for("A reconnected", lambda: proxy.accepted > before, 6 * HEARTBEAT_S + 20,
                 harness)
        harness.stop_all()
        # And no job was lost, each made its effect once, and no delivery was acked before
        # its job's result was saved
        assert queue.counts() == {"done": 40}
        effects = harness.effects()
        assert set(effects) == set(ids) and max(effects.values()) == 1
        redelivered = 0
        for job_id in ids:
            journal = queue.journal(job_id)
            names = [e.event for e in journal]
            assert "result_saved" in names, names
            if "ack_sent" in names:
                assert names.index("result_saved") < names.index("ack_sent"), names
            redelivered += any(e.event == "received" and e.data["redelivered"] for e in journal)
        # And A's unacked deliveries did come back (their acks were cut off)
        assert redelivered >= 1
    finally:
        proxy.close()


# --- the reverse: a consumer cut off from its store, not from RabbitMQ ----------------------

#: The held job's lease, and the consumer's lease-clock margin (AppExecutor's default, 1 s):
#: it abandons the job 2 s after the last confirmation was sent, 1 s before the store could
#: give it to anyone else.
LEASE_S = 3.0
BEAT_S = 0.5
TOPOLOGY = Topology()


class StoreCut:
    """A store as seen from behind a partition: while ``cut`` is set every call raises
    ``StoreUnavailable`` (the heartbeat, the completion, the journal, the claim)."""

    def __init__(self, store: leaseq.Store):
        self._store = store
        self.cut = threading.Event()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._store, name)
        if not callable(value) or name == "close":
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.cut.is_set():
                raise StoreUnavailable("the test's partition from the store")
            return value(*args, **kwargs)

        return call


class Held:
    """The held task's runs: each waits for ``release`` while checking its lease, then makes
    its effect; a run whose lease was lost makes none."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.lost = threading.Event()
        self.effects: list[tuple[str, str]] = []  # (job id, consumer)
        self._lock = threading.Lock()

    def run(self, job: leaseq.Job, consumer: str) -> str:
        self.started.set()
        try:
            while not self.release.wait(0.01):
                job.check()
            job.check()
        except LeaseLost:
            self.lost.set()
            raise
        with self._lock:
            self.effects.append((job.id, consumer))
        return "done"


def consumer_app(store: Any, held: Held, name: str) -> leaseq.App:
    app = leaseq.App(store=store,
                     queues={"jobs": {"lease_s": LEASE_S, "heartbeat_every_s": BEAT_S}})

    @app.task(queue="jobs", name="hold")
    def hold(job: leaseq.Job) -> str:
        return held.run(job, name)

    return app


@contextmanager
def in_thread(run: Callable[[threading.Event], None]) -> Iterator[threading.Event]:
    """``run(stop)`` in a thread until the block ends (then stopped and joined, bounded)."""
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(timeout=20)
        assert not thread.is_alive(), "a consumer or dispatcher did not stop"


@contextmanager
def consuming(store: Any, held: Held, name: str, amqp_url: str) -> Iterator[None]:
    """A real consumer ``name`` of queue ``jobs`` on ``store``, with the worker's executor."""
    app = consumer_app(store, held, name)
    executor = AppExecutor(app)
    consumer = Consumer([app.queue("jobs")], executor, amqp_url, topology=TOPOLOGY,
                        worker_id=name,
                        config=ConsumerConfig(concurrency=2, grace_s=2, max_backoff_s=1.0))
    try:
        with in_thread(consumer.run):
            yield
    finally:
        executor.close()


def dispatching(store: leaseq.Store, amqp_url: str) -> Any:
    """A dispatcher whose own reclaim is off: the test reclaims, so that the only message of
    the job until then is the first one."""
    queue = store.queue("jobs", max_attempts=3)
    config = DispatcherConfig(poll_interval_s=0.2, reclaim_every_s=0, retry_publish_s=0.5,
                              max_backoff_s=1.0)
    return in_thread(Dispatcher([queue], amqp_url, topology=TOPOLOGY, config=config).run)


def message_counts(amqp_url: str) -> dict[str, int]:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = conn.channel()
        return {name: channel.queue_declare(name, passive=True).method.message_count
                for name in (TOPOLOGY.quarantine_queue("jobs"),
                             TOPOLOGY.delivery_limit_queue("jobs"))}
    finally:
        conn.close()


def redelivered(queue: leaseq.Queue, job_id: str) -> bool:
    return any(e.event == "received" and e.data.get("redelivered")
               for e in queue.journal(job_id))


def done_after_reclaim(queue: leaseq.Queue, job_id: str) -> bool:
    queue.reclaim_expired()  # the lapsed lease makes the job owed again (the dispatcher's part)
    return queue.get(job_id).status == "done"


@pytest.mark.parametrize("finisher", ["another-consumer", "same-consumer"])
def test_a_consumer_cut_off_from_its_store_requeues_the_job_and_never_acks_it_unfinished(
        harness: Harness, finisher: str) -> None:
    held = Held()
    queue = harness.queue()
    cut_off = StoreCut(leaseq.connect(harness.store_url))
    healthy = leaseq.connect(harness.store_url)
    dispatcher_store = leaseq.connect(harness.store_url)
    try:
        with dispatching(dispatcher_store, harness.amqp_url), \
                consuming(cut_off, held, "consumer-a", harness.amqp_url):
            # Given consumer A running a delivered job that holds on until it is released
            queue.enqueue("held", {}, task="hold")
            wait_for("A runs the job", held.started.is_set, 30, harness)
            # When A's store stops answering (RabbitMQ still does)
            cut_off.cut.set()
            # Then A's lease clock abandons the job, whose handler sees its lease lost
            wait_for("A abandons the job", held.lost.is_set, LEASE_S + 5, harness)
            held.release.set()  # every later run finishes at once
            if finisher == "same-consumer":
                cut_off.cut.clear()  # And A's store comes back
            with (consuming(healthy, held, "consumer-b", harness.amqp_url)
                  if finisher == "another-consumer" else _nothing()):
                # And the delivery went back to RabbitMQ: it is received again before the
                # test reclaims anything (until then that first message is the only one)
                wait_for("the requeued delivery received again",
                         lambda: redelivered(queue, "held"), 30, harness)
                # And once the lease lapses the job is run to done
                wait_for("the job done", lambda: done_after_reclaim(queue, "held"), 30,
                         harness)
            if finisher == "another-consumer":
                # And A, its store back, takes work again by itself
                cut_off.cut.clear()
                queue.enqueue("after", {}, task="hold")
                wait_for("A runs a new job", lambda: done_after_reclaim(queue, "after"), 30,
                         harness)
        journal = queue.journal("held")
        lines = "\n".join(story(queue, "held"))
        # And A journaled its abandonment once its store answered again
        assert [e.worker_id for e in journal if e.event == "lease_abandoned"] == [
            "consumer-a"], lines
        # And the job made its effect exactly once, by a run that was not A's abandoned one
        assert [e for e in held.effects if e[0] == "held"] == [
            ("held", "consumer-b" if finisher == "another-consumer" else "consumer-a")], lines
        assert journal[[e.event for e in journal].index("claimed")].worker_id == "consumer-a"
        # And no delivery of it was acked without a result: every ack came after the result
        # was saved, or on the store's word that the job was not claimable
        saved = [e.event for e in journal].index("result_saved")
        for i, e in enumerate(journal):
            if e.event == "ack_sent":
                assert i > saved or (e.reason or "").startswith("ack; not claimable"), lines
        # And nothing reached the quarantine (nor the delivery-limit dead letters)
        assert message_counts(harness.amqp_url) == {
            TOPOLOGY.quarantine_queue("jobs"): 0, TOPOLOGY.delivery_limit_queue("jobs"): 0}
        if finisher == "another-consumer":
            assert ("after", "consumer-a") in held.effects
    finally:
        for store in (cut_off, healthy, dispatcher_store):
            store.close()


@contextmanager
def _nothing() -> Iterator[None]:
    yield
