"""Broker delivery against the real local RabbitMQ (issue 6): each test in its own vhost with its
own SQLite file, consumers and dispatchers as real processes, crash points set deterministically
by environment variables in procs.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pika
import pytest
from rabbit_harness import Harness, rabbitmqctl, story, wait_for

from leaseq.delivery.quarantine import describe, peek
from leaseq.delivery.rabbitmq import Topology, declare_topology
from leaseq.errors import TopologyError

pytestmark = pytest.mark.rabbitmq

TOPOLOGY = Topology()


def events(harness: Harness, job_id: str) -> list[str]:
    return [e.event for e in harness.queue().journal(job_id)]


def nack_sent(harness: Harness, job_id: str) -> bool:
    """The job's delivery was settled with nack(requeue=False). Not "the last event": the
    dispatcher journals a publish confirmed after the job moved on (``published``), and that
    confirm may come after a fast consumer's nack."""
    return any(e.event == "ack_sent" and (e.reason or "").startswith("nack requeue=false")
               for e in harness.queue().journal(job_id))


def enqueue(harness: Harness, count: int, prefix: str = "job", **payload: object) -> list[str]:
    queue = harness.queue()
    ids = [f"{prefix}-{i:04d}" for i in range(count)]
    queue.enqueue_many([queue.spec(i, {"n": n, **payload}, task="work")
                        for n, i in enumerate(ids)])
    return ids


def all_done(harness: Harness, total: int) -> bool:
    return harness.queue().counts().get("done", 0) >= total


def quarantined_messages(amqp_url: str, expected: int) -> list[dict]:
    """The quarantine queue's messages (acked: the test's vhost is deleted afterwards)."""
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel, found = conn.channel(), []
        deadline = time.monotonic() + 10
        while len(found) < expected and time.monotonic() < deadline:
            method, props, body = channel.basic_get(TOPOLOGY.quarantine_queue("jobs"), True)
            if method is None:
                time.sleep(0.05)
                continue
            found.append({**describe(props.headers or {}, body), "headers": props.headers})
        return found
    finally:
        conn.close()


def work_queue_depth(amqp_url: str) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        declared = conn.channel().queue_declare(TOPOLOGY.work_queue("jobs"), passive=True)
        return declared.method.message_count
    finally:
        conn.close()


# --- 1. many consumers, many jobs -----------------------------------------------------------


@pytest.mark.parametrize("store", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_1000_jobs_over_three_consumers_each_done_once(store: str,
                                                        request: pytest.FixtureRequest) -> None:
    harness: Harness = request.getfixturevalue("harness" if store == "sqlite"
                                               else "postgres_harness")
    # Given 1,000 jobs, three consumer processes and two dispatchers (one the real CLI)
    ids = enqueue(harness, 1000)
    for _ in range(3):
        harness.start("consume", "--concurrency", "4")
    harness.start_cli_dispatcher()
    harness.start("dispatch")
    # When they run until every job is done
    wait_for("1,000 jobs done", lambda: all_done(harness, 1000), 90, harness)
    # Then every job is done once in the database, with one unique effect each
    queue = harness.queue()
    assert queue.counts() == {"done": 1000}
    effects = harness.effects()
    assert len(effects) == 1000 and set(effects) == set(ids)
    assert max(effects.values()) == 1, "a job made its effect twice"
    # and, with no crash, one dispatcher published each job once and each delivery was acked
    # (once the processes have stopped: a publish confirmed after its job was done is
    # journaled after the fact)
    harness.stop_all()
    sample = [queue.journal(i) for i in ids[::50]]
    for journal in sample:
        names = [e.event for e in journal]
        assert names.count("published") == 1, names
        assert names.count("claimed") == 1 and names.count("ack_sent") == 1, names


# --- 2. crash after the result, before the ack ----------------------------------------------


def test_crash_after_result_before_ack_is_redelivered_and_acked_without_effect(
        harness: Harness) -> None:
    # Given one job and a consumer that SIGKILLs itself right after that job's result is saved
    (job_id,) = enqueue(harness, 1, prefix="crash")
    doomed = harness.start("consume", LEASEQ_TEST_KILL_AFTER_RESULT=job_id)
    harness.start("dispatch")
    # When it dies between the durable result and the ack
    assert doomed.wait(timeout=30) == -signal.SIGKILL
    queue = harness.queue()
    assert queue.get(job_id).status == "done"
    assert "ack_sent" not in events(harness, job_id)
    # and another consumer takes the redelivery
    harness.start("consume")
    wait_for("the redelivery's ack", lambda: "ack_sent" in events(harness, job_id), 30, harness)
    # Then the redelivery came with `redelivered`, was acked without a second effect,
    # and the journal shows result_saved before the first ack_sent
    journal = queue.journal(job_id)
    print(f"\njournal of {job_id}:\n" + "\n".join(story(queue, job_id)))
    names = [e.event for e in journal]
    received = [e for e in journal if e.event == "received"]
    assert [r.data["redelivered"] for r in received] == [False, True]
    assert received[1].data["delivery_count"] >= 1
    assert names.index("result_saved") < names.index("ack_sent")
    assert names.index("result_saved") < names.index("received", names.index("received") + 1)
    assert names.count("claimed") == 1 and names.count("result_saved") == 1
    assert "already done" in journal[names.index("ack_sent")].reason
    assert harness.effects()[job_id] == 1
    assert queue.get(job_id).attempts == 1
    _inspect_shows_the_story(harness, job_id)


def test_crash_after_a_failure_before_its_nack_is_dead_lettered_on_redelivery(
        harness: Harness) -> None:
    # Given a poison job and a consumer that SIGKILLs itself right after writing `failed`
    harness.queue().enqueue("poison", {"n": 1, "poison": True}, task="work")
    doomed = harness.start("consume", LEASEQ_TEST_KILL_AFTER_RESULT="poison")
    harness.start("dispatch")
    # When it dies between the durable failure and the nack
    assert doomed.wait(timeout=30) == -signal.SIGKILL
    queue = harness.queue()
    assert (queue.get("poison").status, queue.get("poison").failure) == ("failed", "permanent")
    assert "ack_sent" not in events(harness, "poison")
    # and another consumer takes the redelivery
    harness.start("consume")
    wait_for("the redelivery's nack", lambda: nack_sent(harness, "poison"), 30, harness)
    # Then the message is dead-lettered as the lost nack would have done, without a new claim
    (message,) = quarantined_messages(harness.amqp_url, 1)
    assert message["job_id"] == "poison" and message["reason"] == "rejected"
    names = events(harness, "poison")
    assert names.count("claimed") == 1 and names.count("received") == 2, names
    ack = queue.journal("poison")[names.index("ack_sent")]
    assert "already failed" in ack.reason
    assert work_queue_depth(harness.amqp_url) == 0


def _inspect_shows_the_story(harness: Harness, job_id: str) -> None:
    """``leaseq inspect`` tells the same story."""
    done = subprocess.run([sys.executable, "-m", "leaseq.cli", "inspect", job_id, "--url",
                           harness.store_url, "--queue", "jobs", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    journal = json.loads(done.stdout)["journal"]
    names = [e["event"] for e in journal]
    assert names.index("result_saved") < names.index("ack_sent")
    redelivery = [e for e in journal if e["event"] == "received" and e["data"]["redelivered"]]
    assert redelivery and names.index("result_saved") < journal.index(redelivery[0])
    human = subprocess.run([sys.executable, "-m", "leaseq.cli", "inspect", job_id, "--url",
                            harness.store_url, "--queue", "jobs"],
                           capture_output=True, text=True, timeout=60)
    print(human.stdout)


# --- 3. transient failure -------------------------------------------------------------------


def test_transient_failure_is_retried_after_its_not_before_and_attempts_are_bounded(
        harness: Harness) -> None:
    # Given a job that fails twice then succeeds, and one that always fails (max 3 attempts)
    (flaky,) = enqueue(harness, 1, prefix="flaky", fail_times=2, retry_delay_s=1.0)
    (hopeless,) = enqueue(harness, 1, prefix="hopeless", fail_times=99, retry_delay_s=0.5)
    harness.start("consume")
    harness.start("dispatch")
    # When they run
    queue = harness.queue()
    wait_for("both settled", lambda: queue.get(flaky).status == "done"
             and queue.get(hopeless).status == "failed"
             and nack_sent(harness, hopeless), 30, harness)
    # (A publish whose job a consumer took before the broker's confirm came back is journaled
    # by the dispatcher after the fact: possibly after the job is done.)
    wait_for("each publish journaled", lambda: [
        e.event for e in queue.journal(flaky)].count("published") >= 3, 30, harness)
    # Then each retry was claimed only after its not-before, never before
    journal = queue.journal(flaky)
    for i, entry in enumerate(journal):
        if entry.event == "retry_scheduled":
            next_claim = next(e for e in journal[i:] if e.event == "claimed")
            waited = (next_claim.at - entry.at).total_seconds()
            assert waited >= entry.data["delay_s"], (waited, entry.data)
    names = [e.event for e in journal]
    assert names.count("retry_scheduled") == 2 and names.count("claimed") == 3
    assert names.count("published") == 3  # the dispatcher published each retry when due
    assert harness.effects()[flaky] == 1
    # and the hopeless job stopped after its 3 attempts, quarantined as exhausted
    failed = queue.get(hopeless)
    assert (failed.attempts, failed.failure) == (3, "exhausted")
    assert [e.event for e in queue.journal(hopeless)].count("claimed") == 3
    (message,) = quarantined_messages(harness.amqp_url, 1)
    assert message["job_id"] == hopeless and message["reason"] == "rejected"


# --- 4. invalid payload and permanent error -------------------------------------------------


def test_invalid_and_permanent_are_quarantined_in_the_db_and_the_quarantine_queue(
        harness: Harness) -> None:
    # Given a job whose payload does not fit its task, and a poison job
    queue = harness.queue()
    queue.enqueue("bad-payload", {"n": "not a number"}, task="work")
    queue.enqueue("poison", {"n": 1, "poison": True}, task="work")
    harness.start("consume")
    harness.start("dispatch")
    # When they are delivered
    wait_for("both nacked", lambda: all(
        nack_sent(harness, j) for j in ("bad-payload", "poison")), 30, harness)
    # Then both are failed in the database with their reason
    assert (queue.get("bad-payload").status, queue.get("bad-payload").failure) == \
        ("failed", "invalid")
    assert (queue.get("poison").status, queue.get("poison").failure) == ("failed", "permanent")
    # and both messages sit in the quarantine queue, dead-lettered as rejected
    messages = quarantined_messages(harness.amqp_url, 2)
    assert sorted(m["job_id"] for m in messages) == ["bad-payload", "poison"]
    for message in messages:
        death = message["headers"]["x-death"][0]
        assert death["reason"] == "rejected" and death["queue"] == TOPOLOGY.work_queue("jobs")
    # and no retry loop formed: one claim each, quarantined before the nack, queue empty
    for job_id in ("bad-payload", "poison"):
        names = events(harness, job_id)
        assert names.count("claimed") == 1 and names.count("received") == 1, names
        assert names.index("quarantined") < names.index("ack_sent")
        assert queue.journal(job_id)[names.index("ack_sent")].reason.startswith(
            "nack requeue=false")
    assert work_queue_depth(harness.amqp_url) == 0
    assert harness.effects() == {}


# --- 5. dispatcher killed between publish and mark ------------------------------------------


def test_dispatcher_killed_between_publish_and_mark_publishes_twice_with_one_effect(
        harness: Harness) -> None:
    # Given five jobs and a dispatcher that dies after the confirms, before marking
    ids = enqueue(harness, 5, prefix="outbox")
    doomed = harness.start("dispatch", LEASEQ_TEST_KILL_BEFORE_MARK="1")
    assert doomed.wait(timeout=30) == -signal.SIGKILL
    queue = harness.queue()
    assert all(queue.get(i).published_at is None for i in ids)  # still owed
    # When a second dispatcher publishes them again, and then a consumer runs
    harness.start("dispatch")
    wait_for("the second publish", lambda: all(queue.get(i).published_at for i in ids), 30,
             harness)
    harness.start("consume")
    wait_for("both deliveries settled", lambda: all(
        events(harness, i).count("ack_sent") == 2 for i in ids), 30, harness)
    # Then each job got two deliveries, ran once and made one effect
    for job_id in ids:
        names = events(harness, job_id)
        assert names.count("received") == 2 and names.count("claimed") == 1, names
        assert names.count("result_saved") == 1
    assert harness.effects() == {i: 1 for i in ids}
    assert queue.counts() == {"done": 5}


# --- 6. broker restarts under load ----------------------------------------------------------

RESTARTS = 10
WAVE = 40


def test_broker_restarted_ten_times_under_load_loses_no_job_and_no_process(
        harness: Harness) -> None:
    # Given two consumers and a dispatcher working through waves of jobs
    harness.start("consume", "--concurrency", "4")
    harness.start("consume", "--concurrency", "4")
    harness.start("dispatch")
    for cycle in range(RESTARTS):
        # When a wave is under way (some of it done: everyone is connected again)
        enqueue(harness, WAVE, prefix=f"wave{cycle:02d}", sleep_s=0.2)
        wait_for(f"progress in wave {cycle}", lambda c=cycle: _done_in_wave(harness, c) >= 5
                 or not _all_alive(harness), 60, harness)
        assert _all_alive(harness), f"a process died in cycle {cycle}\n{harness.logs()}"
        # and the broker stops and comes back
        _restart_broker()
    # Then every process is still there and every job was done, each effect made once
    wait_for("every wave done", lambda: all_done(harness, RESTARTS * WAVE)
             or not _all_alive(harness), 90, harness)
    assert _all_alive(harness), f"a process died instead of reconnecting\n{harness.logs()}"
    assert harness.queue().counts() == {"done": RESTARTS * WAVE}
    effects = harness.effects()
    assert len(effects) == RESTARTS * WAVE and max(effects.values()) == 1, effects.most_common(3)


def _done_in_wave(harness: Harness, cycle: int) -> int:
    prefix = f"wave{cycle:02d}-"
    return sum(1 for job_id in harness.effects() if job_id.startswith(prefix))


def _all_alive(harness: Harness) -> bool:
    return all(p.poll() is None for p in harness.procs)


def _restart_broker() -> None:
    rabbitmqctl("stop_app")
    try:
        time.sleep(0.2)  # a real outage, however short: the clients must see the connection drop
    finally:
        rabbitmqctl("start_app")
        rabbitmqctl("await_startup")


# --- 7. store outage: messages dead-lettered at the delivery limit ---------------------------

OUTAGE_JOBS = 8


def test_store_outage_past_the_delivery_limit_ends_with_every_job_done_unaided(
        harness: Harness) -> None:
    # Given a delivery limit of 2, a poison job quarantined (its message rejected) ...
    limit = ("--delivery-limit", "2")
    outage = harness.folder / "store-is-down"
    down = {"LEASEQ_TEST_STORE_DOWN": str(outage)}
    harness.queue().enqueue("poison", {"n": 0, "poison": True}, task="work")
    first = harness.start("consume", *limit, **down)
    harness.start("dispatch", *limit, **down)
    wait_for("the poison quarantined", lambda: nack_sent(harness, "poison"), 30, harness)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=30) == 0
    # ... and jobs published while no consumer ran
    ids = enqueue(harness, OUTAGE_JOBS, prefix="outage")
    queue = harness.queue()
    wait_for("the jobs published", lambda: all(queue.get(i).published_at for i in ids), 30,
             harness)
    # When the store goes down under a consumer until RabbitMQ dead-letters every message
    # at its delivery limit (each dropped session returns them), and then comes back
    outage.touch()
    harness.start("consume", "--concurrency", str(OUTAGE_JOBS), *limit, **down)
    wait_for("every message dead-lettered at the delivery limit",
             lambda: _depth(harness.amqp_url, TOPOLOGY.delivery_limit_queue("jobs"))
             == OUTAGE_JOBS, 60, harness)
    outage.unlink()
    # Then, with nobody's help, every job is done once ...
    wait_for("every job done", lambda: all_done(harness, OUTAGE_JOBS), 60, harness)
    assert queue.counts() == {"done": OUTAGE_JOBS, "failed": 1}
    assert harness.effects() == {i: 1 for i in ids}
    for job_id in ids:
        names = events(harness, job_id)
        assert names.index("publish_owed") < names.index("claimed"), names
    # ... the real quarantine holds the poison's rejected message alone, untouched ...
    count, items = peek(harness.amqp_url, TOPOLOGY, "jobs")
    assert count == 1 and items[0]["job_id"] == "poison" and items[0]["reason"] == "rejected"
    assert items[0]["count"] == 1
    # ... the dead letters are acked, and every process is still there
    assert _depth(harness.amqp_url, TOPOLOGY.delivery_limit_queue("jobs")) == 0
    assert all(p.poll() is None for p in harness.procs if p is not first), harness.logs()


def _depth(amqp_url: str, name: str) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        return conn.channel().queue_declare(name, passive=True).method.message_count
    finally:
        conn.close()


# --- topology start-up check ----------------------------------------------------------------


def test_start_up_refuses_a_work_queue_declared_without_the_dead_letter_route(
        amqp_url: str) -> None:
    # Given the work queue declared earlier by someone else, without dead-letter arguments
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    conn.channel().queue_declare(TOPOLOGY.work_queue("jobs"), durable=True,
                                 arguments={"x-queue-type": "quorum"})
    conn.close()
    # When leaseq starts on it / Then it refuses, naming the argument
    with pytest.raises(TopologyError, match="x-dead-letter-exchange"):
        declare_topology(["jobs"], amqp_url)


def test_start_up_check_refuses_a_missing_dead_letter_exchange(amqp_url: str) -> None:
    # Given a complete topology whose dead-letter exchange was then deleted
    declare_topology(["jobs"], amqp_url)
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    conn.channel().exchange_delete(TOPOLOGY.dead_letter_exchange)
    conn.close()
    # When leaseq checks it without declaring / Then it refuses
    with pytest.raises(TopologyError, match="dead-letter"):
        declare_topology(["jobs"], amqp_url, declare=False)
    # and declaring repairs it idempotently
    declare_topology(["jobs"], amqp_url)
    declare_topology(["jobs"], amqp_url, declare=False)


def test_declare_over_an_older_topology_sorts_dead_letters_by_reason(amqp_url: str) -> None:
    # Given the topology of an earlier version: the quarantine bound to the dead-letter
    # exchange directly, so it took every dead letter whatever the reason
    topology = Topology(delivery_limit=1)
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = conn.channel()
    channel.exchange_declare(topology.dead_letter_exchange, "direct", durable=True)
    channel.queue_declare(topology.quarantine_queue("jobs"), durable=True,
                          arguments={"x-queue-type": "quorum"})
    channel.queue_bind(topology.quarantine_queue("jobs"), topology.dead_letter_exchange,
                       routing_key="jobs")
    conn.close()
    # When leaseq declares its topology over it (twice: it is idempotent)
    declare_topology(["jobs"], amqp_url, topology=topology)
    declare_topology(["jobs"], amqp_url, topology=topology)
    # Then a rejected message reaches the quarantine alone, and one returned past the
    # delivery limit reaches the delivery-limit queue alone
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = conn.channel()
        for body in (b"rejected", b"returned"):
            channel.basic_publish(topology.exchange, "jobs", body)
        method, _, body = _get(channel, topology.work_queue("jobs"))
        assert body == b"rejected"
        channel.basic_nack(method.delivery_tag, requeue=False)
        for _ in range(2):  # a delivery limit of 1: the second return dead-letters it
            method, _, body = _get(channel, topology.work_queue("jobs"))
            assert body == b"returned"
            channel.basic_nack(method.delivery_tag, requeue=True)
        assert _get(channel, topology.delivery_limit_queue("jobs"))[2] == b"returned"
        assert _get(channel, topology.quarantine_queue("jobs"))[2] == b"rejected"
        for queue in (topology.quarantine_queue("jobs"), topology.delivery_limit_queue("jobs")):
            assert channel.basic_get(queue)[0] is None, f"a second dead letter in {queue}"
    finally:
        conn.close()


def _get(channel: object, queue: str) -> tuple:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = channel.basic_get(queue, auto_ack=False)  # type: ignore[attr-defined]
        if got[0] is not None:
            return got
        time.sleep(0.02)
    pytest.fail(f"nothing arrived in {queue}")

