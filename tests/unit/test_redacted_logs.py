"""Every log line that shows an exception shows it redacted: the connection and consumer of the
RabbitMQ delivery, the dispatcher, the scheduler, the sweeper loop, the metrics collectors, the
SQLite checkpointer and the PostgreSQL listener. Each test makes its site log an error whose
message holds a URL password and a ``token=``, then reads every captured record as a handler
would print it (message and any traceback): the secrets are gone, what happened is still said.
No broker or database server is needed: the sites are called directly, on stand-ins."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq import sweeper
from leaseq.delivery.connection import Reconnect, encode, reconnecting
from leaseq.delivery.consumer import Consumer, Settlement, _Delivery, _Session
from leaseq.delivery.dispatcher import Dispatcher
from leaseq.errors import LeaseqError, StoreUnavailable
from leaseq.metrics import ScheduleCollector
from leaseq.redact import redact
from leaseq.scheduler import Scheduler
from leaseq.stores.postgres.listen import Listener
from leaseq.stores.sqlite import checkpoint
from leaseq.worker import Worker

PASSWORD = "Zq9hunter2canary"
TOKEN = "tok3nS3cr3tValue"
MESSAGE = f"cannot reach postgresql://app:{PASSWORD}@db.example/jobs with token={TOKEN}"
#: What the built-in redactor leaves of ``MESSAGE``: the useful part.
BUILT_IN = "cannot reach postgresql://app:***@db.example/jobs with token=***"
#: What the app's redactor (``mine``) leaves of it: its own rule was applied too.
APPS = "cannot reach postgresql://app:***@[host]/jobs with token=***"


def mine(text: str) -> str:
    """An app's redactor: the built-in one, and the database host hidden as well."""
    return redact(text).replace("db.example", "[host]")


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """Every captured record as a handler prints it: the message and any traceback."""
    formatter = logging.Formatter("%(levelname)s %(name)s %(message)s")
    return "\n".join(formatter.format(r) for r in caplog.records)


def assert_redacted(caplog: pytest.LogCaptureFixture, *useful: str) -> str:
    text = logged(caplog)
    assert caplog.records, "nothing was logged"
    assert PASSWORD not in text and TOKEN not in text, text
    assert all(r.exc_info is None for r in caplog.records), "a raw traceback was attached"
    for part in useful:
        assert part in text, (part, text)
    return text


@pytest.fixture
def app(tmp_path: Path) -> Iterator[leaseq.App]:
    """An app with a redactor of its own, a task, and an hourly schedule."""
    app = leaseq.App(f"sqlite:///{tmp_path / 'jobs.db'}", redact=mine)

    @app.task(queue="jobs")
    def work() -> None:
        """Nothing."""

    @app.periodic(every_s=3600, queue="jobs")
    def hourly() -> None:
        """Once an hour."""

    yield app
    app.store.close()


# --- RabbitMQ delivery: the connection, the consumer, the dispatcher --------------------------


@pytest.mark.parametrize("error", [ConnectionError(MESSAGE), ValueError(MESSAGE)],
                         ids=["expected", "unexpected"])
def test_a_lost_session_is_logged_redacted(
        error: Exception, caplog: pytest.LogCaptureFixture) -> None:
    # Given a session that fails once with an error that holds secrets, then stops the loop
    stop = threading.Event()

    def run() -> None:
        stop.set()
        raise error

    # When the reconnecting loop meets it
    with caplog.at_level(logging.WARNING, logger="leaseq.delivery"):
        reconnecting(run, stop, "consumer", 0.01, mine)
    # Then the warning names the error, redacted by the redactor given
    text = assert_redacted(caplog, f"consumer: session lost ({type(error).__name__}: {APPS})")
    # And an error nobody expected comes with its traceback, redacted too
    assert ("Traceback (most recent call last)" in text) == isinstance(error, ValueError)


def consumer_of(app: leaseq.App, execute: Any = None) -> tuple[Consumer, leaseq.Queue]:
    queue = app.queue("jobs")
    return Consumer([queue], execute or (lambda job: job), "amqp://"), queue


class Conn:
    """A connection stand-in: runs a callback at once, or fails to take it with ``error``."""

    def __init__(self, error: BaseException | None = None):
        self.error = error

    def add_callback_threadsafe(self, callback: Any) -> None:
        if self.error is not None:
            raise self.error
        callback()


class Channel:
    def basic_ack(self, tag: int) -> None:
        pass


def delivery(queue: str, job_id: str, conn: Conn | None = None) -> _Delivery:
    session = _Session(conn or Conn(), Channel(), threading.Event())  # type: ignore[arg-type]
    return _Delivery(session, queue, 7, False, 0, encode(queue, job_id))


def test_a_consumers_unsettled_delivery_is_logged_redacted(
        app: leaseq.App, caplog: pytest.LogCaptureFixture) -> None:
    # Given a job whose run fails in a way no handler outcome covers (a store error)
    def execute(job: leaseq.Job) -> leaseq.Job:
        raise RuntimeError(MESSAGE)

    consumer, queue = consumer_of(app, execute)
    queue.enqueue("j", {}, task="work")
    d = delivery("jobs", "j")
    # When the consumer handles its delivery
    with caplog.at_level(logging.WARNING, logger="leaseq.delivery"):
        consumer._handle(d)
    # Then the log says which delivery was not settled, and why, redacted by the queue's app
    text = assert_redacted(caplog, "delivery 7 of queue 'jobs' not settled",
                           f"RuntimeError: {APPS}", "Traceback (most recent call last)")
    assert "[host]" in text
    # And the error that drops the session (logged again when it is lost) is redacted too
    assert isinstance(d.session.broken, Reconnect)
    assert str(d.session.broken) == f"RuntimeError: {APPS}"


def test_an_ack_the_consumer_could_not_send_is_logged_redacted(
        app: leaseq.App, caplog: pytest.LogCaptureFixture) -> None:
    # Given a delivery whose connection dropped before its ack could be handed over
    consumer, queue = consumer_of(app)
    queue.enqueue("j", {}, task="work")
    d = delivery("jobs", "j", Conn(ConnectionError(MESSAGE)))
    # When the consumer settles it
    with caplog.at_level(logging.WARNING, logger="leaseq.delivery"):
        consumer._settle(d, queue.get("j"), Settlement.ACK, "done")
    # Then the warning says the ack was not sent, and why, redacted
    assert_redacted(caplog, "ack of delivery 7 (job 'j') not sent",
                    f"ConnectionError: {APPS}")


def test_an_ack_sent_the_consumer_could_not_journal_is_logged_redacted(
        app: leaseq.App, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a store that fails to journal ack_sent
    consumer, queue = consumer_of(app)
    queue.enqueue("j", {}, task="work")

    def append_journal(*args: Any, **kwargs: Any) -> None:
        raise StoreUnavailable(MESSAGE)

    monkeypatch.setattr(app.store, "append_journal", append_journal)
    # When the consumer settles a delivery (the ack goes out)
    with caplog.at_level(logging.WARNING, logger="leaseq.delivery"):
        consumer._settle(delivery("jobs", "j"), queue.get("j"), Settlement.ACK, "done")
    # Then the missing journal line is logged, redacted, with its redacted traceback
    assert_redacted(caplog, "could not journal ack_sent for job 'j'",
                    f"StoreUnavailable: {APPS}", "Traceback (most recent call last)")


def test_an_outbox_the_dispatcher_could_not_prepare_is_logged_redacted(
        app: leaseq.App, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a store that refuses to prepare its outbox, saying something secret
    def prepare_outbox(stop: threading.Event | None = None) -> None:
        raise RuntimeError(MESSAGE)

    monkeypatch.setattr(app.store, "prepare_outbox", prepare_outbox)
    dispatcher = Dispatcher([app.queue("jobs")], "amqp://")
    # When the dispatcher prepares the outboxes
    with caplog.at_level(logging.WARNING, logger="leaseq.delivery"):
        dispatcher._prepare_outboxes(threading.Event())
    # Then it says so, redacted by the queue's app, with its redacted traceback
    assert_redacted(caplog, "could not prepare the outbox of store", f"RuntimeError: {APPS}",
                    "Traceback (most recent call last)")


# --- the scheduler ---------------------------------------------------------------------------


@pytest.mark.parametrize("error", [StoreUnavailable(MESSAGE), RuntimeError(MESSAGE)],
                         ids=["store", "unexpected"])
def test_the_schedulers_loop_logs_its_errors_redacted(
        app: leaseq.App, error: Exception, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a scheduler whose look at the ledger fails once, and then is stopped
    stop = threading.Event()
    scheduler = Scheduler(app)

    def run_once() -> float:
        stop.set()
        raise error

    monkeypatch.setattr(scheduler, "run_once", run_once)
    # When it loops
    with caplog.at_level(logging.WARNING, logger="leaseq.scheduler"):
        scheduler.run(stop)
    # Then the error is logged through the app's redactor
    text = assert_redacted(caplog, f"{type(error).__name__}: {APPS}", "trying again")
    # And an unexpected one with its traceback, redacted
    assert ("Traceback (most recent call last)" in text) == isinstance(error, RuntimeError)


def test_a_schedule_whose_look_fails_is_logged_redacted(
        app: leaseq.App, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a schedule whose look fails
    scheduler = Scheduler(app)

    def look(*args: Any) -> float:
        raise LeaseqError(MESSAGE)

    monkeypatch.setattr(scheduler, "_look", look)
    # When the scheduler runs once
    with caplog.at_level(logging.WARNING, logger="leaseq.scheduler"):
        scheduler.run_once()
    # Then the schedule's failure is logged, redacted by the app's redactor
    assert_redacted(caplog, f"schedule hourly: LeaseqError: {APPS}")


# --- the sweeper loop, the metrics, the stores' own threads ----------------------------------


class StoreAway:
    """A store that is down: the sweep's first call fails (and the loop is then stopped)."""

    def __init__(self, stop: threading.Event):
        self.stop = stop

    def prune_workers(self, gone_after_s: float) -> int:
        self.stop.set()
        raise StoreUnavailable(MESSAGE)


def test_the_sweeper_loop_logs_a_failed_sweep_redacted(
        caplog: pytest.LogCaptureFixture) -> None:
    # Given a store that is away
    stop = threading.Event()
    # When the sweeper loop runs
    with caplog.at_level(logging.WARNING, logger="leaseq.sweeper"):
        sweeper.run_forever(StoreAway(stop), stop=stop)  # type: ignore[arg-type]
    # Then the failed sweep is logged, redacted by the built-in redactor (no app here)
    assert_redacted(caplog, f"sweep failed, will try again in 30 s: StoreUnavailable: {BUILT_IN}")


def test_the_workers_metrics_log_an_unreadable_store_with_the_apps_redactor(
        app: leaseq.App, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a worker's metrics over a store whose counts and ledger cannot be read
    worker = Worker(app)

    def away(*args: Any) -> Any:
        raise StoreUnavailable(MESSAGE)

    monkeypatch.setattr(app.store, "counts", away)
    monkeypatch.setattr(app.store, "schedules", away)
    # When they are scraped
    with caplog.at_level(logging.WARNING, logger="leaseq.metrics"):
        list(worker.metrics.registry.collect())
    # Then both failures are logged through the app's redactor
    assert_redacted(caplog, f"cannot read queue gauges from the store: StoreUnavailable: {APPS}",
                    f"cannot read the schedule ledger: StoreUnavailable: {APPS}")


def test_the_schedule_gauges_use_the_built_in_redactor_by_default(
        app: leaseq.App, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the schedule gauges of a store (``leaseq metrics``: no app) that cannot be read
    def away() -> Any:
        raise StoreUnavailable(MESSAGE)

    monkeypatch.setattr(app.store, "schedules", away)
    # When they are collected
    with caplog.at_level(logging.WARNING, logger="leaseq.metrics"):
        list(ScheduleCollector(app.store).collect())
    # Then the failure is logged, redacted
    assert_redacted(caplog, f"cannot read the schedule ledger: StoreUnavailable: {BUILT_IN}")


def test_a_database_the_checkpointer_cannot_open_is_logged_redacted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a database that SQLite refuses to open, saying something secret
    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        raise sqlite3.OperationalError(MESSAGE)

    monkeypatch.setattr(checkpoint.sqlite3, "connect", connect)
    # When a checkpointer is made for it
    with caplog.at_level(logging.WARNING, logger="leaseq.stores.sqlite"):
        checkpoints = checkpoint.Checkpointer(str(tmp_path / "jobs.db"))
    checkpoints.stop()
    # Then it says the checkpoints stay on the commits, and why, redacted
    assert_redacted(caplog, f"stay on the commits: OperationalError: {BUILT_IN}")


class FailingConnection:
    """A connection whose checkpoint fails at once."""

    def execute(self, sql: str) -> Any:
        raise sqlite3.OperationalError(MESSAGE)

    def close(self) -> None:
        pass


def test_a_checkpoint_that_fails_is_logged_redacted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a checkpointer whose connection fails its first checkpoint
    monkeypatch.setattr(checkpoint.sqlite3, "connect",
                        lambda *args, **kwargs: FailingConnection())
    # When its thread runs (no wait between checkpoints) and ends on that failure
    with caplog.at_level(logging.WARNING, logger="leaseq.stores.sqlite"):
        checkpoints = checkpoint.Checkpointer(str(tmp_path / "jobs.db"), every_s=0)
        checkpoints._thread.join()
    # Then it says the checkpoints are back on the commits, and why, redacted
    assert_redacted(caplog, f"back on the commits: OperationalError: {BUILT_IN}")


def test_a_lost_listen_connection_is_logged_redacted(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a PostgreSQL listener whose LISTEN connection fails, then is stopped on its retry
    listener = Listener("", "leaseq", threading.Event())
    calls: list[int] = []

    def listen() -> None:
        calls.append(1)
        if len(calls) > 1:
            listener._stop.set()
        raise psycopg.OperationalError(f"{MESSAGE}\nDETAIL: a second line")

    monkeypatch.setattr(listener, "_listen", listen)
    # When its thread's loop runs
    with caplog.at_level(logging.WARNING, logger="leaseq.stores.postgres"):
        listener._run()
    # Then the lost connection is logged once, with the first line of the error, redacted
    assert_redacted(caplog, f"LISTEN connection lost ({BUILT_IN})")
    assert len(caplog.records) == 1
