"""Every log line that shows an exception shows it redacted: the connection and consumer of the
RabbitMQ delivery, the dispatcher, and the scheduler. Each test makes its site log an error whose
message holds a URL password and a ``token=``, then reads every captured record as a handler
would print it (message and any traceback): the secrets are gone, what happened is still said.
No broker or database server is needed: the sites are called directly, on stand-ins."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import leaseq
from leaseq.delivery.connection import Reconnect, encode, reconnecting
from leaseq.delivery.consumer import Consumer, _Delivery, _Session
from leaseq.delivery.dispatcher import Dispatcher
from leaseq.errors import LeaseqError, StoreUnavailable
from leaseq.redact import redact
from leaseq.scheduler import Scheduler

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
        consumer._settle(d, queue.get("j"), False, "done")
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
        consumer._settle(delivery("jobs", "j"), queue.get("j"), False, "done")
    # Then the missing journal line is logged, redacted, with its redacted traceback
    assert_redacted(caplog, "could not journal ack_sent for job 'j'",
                    f"StoreUnavailable: {APPS}", "Traceback (most recent call last)")


def test_an_outbox_the_dispatcher_could_not_prepare_is_logged_redacted(
        app: leaseq.App, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a store that refuses to prepare its outbox, saying something secret
    def prepare_outbox() -> None:
        raise RuntimeError(MESSAGE)

    monkeypatch.setattr(app.store, "prepare_outbox", prepare_outbox)
    dispatcher = Dispatcher([app.queue("jobs")], "amqp://")
    # When the dispatcher prepares the outboxes
    with caplog.at_level(logging.WARNING, logger="leaseq.delivery"):
        dispatcher._prepare_outboxes()
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
