"""``leaseq.timeline``: a job's journal read as attempts, with how long each ran and how long
the job waited for its first claim, from hand-built journals."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from leaseq.job import JournalEntry
from leaseq.journal import EXPIRED, LEASE_EXPIRED, REDELIVERED
from leaseq.timeline import TAKEN_AGAIN, format_duration, read_timeline

T0 = datetime(2025, 1, 2, 12, 0, 0, tzinfo=UTC)
W1, W2 = "host:1:aaaa0001", "host:2:bbbb0002"


def at(s: float, event: str, attempt: int | None = None, epoch: int | None = None,
       worker: str | None = None, reason: str | None = None) -> JournalEntry:
    return JournalEntry(T0 + timedelta(seconds=s), "j", event, attempt, epoch, worker, reason)


def test_a_job_done_at_once_waited_then_ran_once() -> None:
    # Given a job enqueued, claimed 2 s later and finished 0.5 s after that
    journal = [at(0, "enqueued", reason="created"), at(2, "claimed", 1, 1, W1),
               at(2.5, "result_saved", 1, 1, W1, "done")]
    # When it is read
    timeline = read_timeline(journal)
    # Then it waited 2 s and its one attempt ran 0.5 s, ended by the saved result
    assert timeline.waited_s == 2.0
    (attempt,) = timeline.attempts
    assert (attempt.number, attempt.worker_id, attempt.ran_s()) == (1, W1, 0.5)
    assert (attempt.ended_by, attempt.reason, attempt.running) == ("result_saved", "done", False)
    assert timeline.notes() == {1: "waited 2.000 s", 2: "attempt 1 ran 0.500 s"}


def test_a_retried_job_has_one_attempt_per_claim() -> None:
    # Given a first attempt that failed and a second, on another worker, that finished
    journal = [at(0, "enqueued"), at(1, "claimed", 1, 1, W1),
               at(4, "retry_scheduled", 1, 1, W1, "ConnectionError: timed out"),
               at(64, "claimed", 2, 2, W2, REDELIVERED), at(65, "result_saved", 2, 2, W2, "done")]
    # When it is read
    timeline = read_timeline(journal)
    # Then each attempt has its own worker, duration and ending; the wait is to the first claim
    first, second = timeline.attempts
    assert (first.worker_id, first.ran_s(), first.ended_by) == (W1, 3.0, "retry_scheduled")
    assert first.reason == "ConnectionError: timed out"
    assert (second.worker_id, second.ran_s(), second.ended_by) == (W2, 1.0, "result_saved")
    assert timeline.waited_s == 1.0
    assert timeline.notes()[2] == "attempt 1 ran 3.000 s"


def test_a_lease_lost_and_taken_by_another_worker_ends_at_the_next_claim() -> None:
    # Given a worker whose lease ran out, another worker's claim, then the first worker's
    # late report that it lost the lease (naming its old epoch)
    journal = [at(0, "enqueued"), at(0, "claimed", 1, 1, W1),
               at(900, "claimed", 2, 2, W2, REDELIVERED),
               at(905, "heartbeat_lost", 2, 1, None, "lease epoch 1 lost; job is processing"),
               at(910, "result_saved", 2, 2, W2, "done")]
    # When it is read
    first, second = read_timeline(journal).attempts
    # Then the first attempt ended at the second claim, and the late report ends nothing
    assert (first.ran_s(), first.ended_by, first.reason) == (900.0, "claimed", TAKEN_AGAIN)
    assert (second.ran_s(), second.ended_by, second.worker_id) == (10.0, "result_saved", W2)


def test_a_lease_reclaimed_by_the_sweeper_ends_there() -> None:
    journal = [at(0, "enqueued"), at(1, "claimed", 1, 1, W1),
               at(31, "reclaimed", 1, 1, W1, LEASE_EXPIRED), at(40, "claimed", 2, 2, W2),
               at(71, "quarantined", 2, 2, W2, EXPIRED)]
    first, second = read_timeline(journal).attempts
    assert (first.ran_s(), first.ended_by, first.reason) == (30.0, "reclaimed", LEASE_EXPIRED)
    assert (second.ran_s(), second.ended_by, second.reason) == (31.0, "quarantined", EXPIRED)


def test_an_attempt_still_running_runs_until_now() -> None:
    # Given a job claimed and not finished
    journal = [at(0, "enqueued"), at(3, "claimed", 1, 1, W1)]
    # When it is read
    timeline = read_timeline(journal)
    (attempt,) = timeline.attempts
    # Then it is running: no duration without a clock, the time since its claim with one
    assert attempt.running and attempt.ran_s() is None
    assert attempt.ran_s(T0 + timedelta(seconds=93)) == 90.0
    assert timeline.notes(T0 + timedelta(seconds=93)) == {
        1: "waited 3.000 s; running for 1 min 30 s"}
    assert timeline.notes() == {1: "waited 3.000 s"}


def test_a_snoozed_and_a_given_back_attempt_end_there() -> None:
    # Given an attempt snoozed, one given back at shutdown, then one running
    journal = [at(0, "enqueued"), at(1, "claimed", 1, 1, W1),
               at(2, "snoozed", 0, 1, W1, "rate limited"), at(7, "claimed", 1, 2, W1),
               at(9, "given_back", 0, 2, W1, "worker shutting down"),
               at(10, "claimed", 1, 3, W2)]
    # When it is read
    snoozed, given_back, running = read_timeline(journal).attempts
    # Then each ends with its own event and reason, and the last one still runs
    assert (snoozed.ran_s(), snoozed.ended_by, snoozed.reason) == (1.0, "snoozed", "rate limited")
    assert (given_back.ran_s(), given_back.ended_by) == (2.0, "given_back")
    assert given_back.reason == "worker shutting down"
    assert running.running and running.lease_epoch == 3


def test_events_outside_an_attempt_end_nothing() -> None:
    # Given a job cancelled while pending, after a finished attempt and an operator's requeue
    journal = [at(0, "enqueued"), at(1, "claimed", 1, 1, W1),
               at(2, "quarantined", 1, 1, W1, "permanent: bad input"),
               at(5, "requeued", 0, 1, None, "operator"), at(6, "cancelled", 0, 1, None)]
    # When it is read, Then the one attempt ended at its quarantine
    (attempt,) = read_timeline(journal).attempts
    assert (attempt.ended_by, attempt.ran_s()) == ("quarantined", 1.0)


def test_a_journal_with_no_enqueue_or_no_claim_has_no_wait() -> None:
    assert read_timeline([]).waited_s is None and read_timeline([]).attempts == ()
    assert read_timeline([at(0, "enqueued")]).waited_s is None
    without_enqueue = read_timeline([at(4, "claimed", 1, 1, W1)])
    assert without_enqueue.waited_s is None and len(without_enqueue.attempts) == 1


def test_rows_without_an_epoch_still_end_the_open_attempt() -> None:
    journal = [at(0, "claimed", 1, None, W1), at(2, "result_saved", 1, None, W1, "done")]
    (attempt,) = read_timeline(journal).attempts
    assert (attempt.ended_by, attempt.ran_s()) == ("result_saved", 2.0)


@pytest.mark.parametrize(("seconds", "words"), [
    (0.0493, "0.049 s"), (-1, "0.000 s"), (12.34, "12.3 s"), (245, "4 min 05 s"),
    (7380, "2 h 03 min"), (273600, "3 d 04 h")])
def test_durations_read_in_the_unit_that_fits(seconds: float, words: str) -> None:
    assert format_duration(seconds) == words
