"""The scheduler's loop: it sleeps until the next tick (never a polling storm), and a store
that fails or a bug does not end it."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

import pytest

import leaseq
from leaseq.errors import InvalidInput, StoreUnavailable
from leaseq.ledger import TickAdvance
from leaseq.scheduler import Scheduler, SchedulerConfig, service
from leaseq.scheduler.plan import plan
from leaseq.testing.harness import advance, seconds_until


@pytest.fixture
def app(tmp_path):
    app = leaseq.App(f"sqlite:///{tmp_path}/s.db")

    @app.periodic(every_s=3600)
    def hourly() -> None:
        """Once an hour."""

    yield app
    app.store.close()


def _half_past(app: leaseq.App) -> None:
    now = app.store.server_now()
    hour = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    advance(app.store, seconds_until(app.store, hour) + 1800)


def test_run_once_answers_the_seconds_until_the_next_tick(app) -> None:
    _half_past(app)
    assert Scheduler(app, SchedulerConfig(max_sleep_s=60)).run_once() == 60
    wait = Scheduler(app, SchedulerConfig(max_sleep_s=7200)).run_once()
    assert 1790 < wait <= 1800


class StopAfter(threading.Event):
    """A stop event that records each wait the loop asks for, without sleeping, and is set
    after ``waits`` of them: the loop's pace is read from its asks, not from a wall clock."""

    def __init__(self, waits: int):
        super().__init__()
        self.asked: list[float] = []
        self._waits = waits

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None, "the scheduler always sleeps a bounded time"
        self.asked.append(timeout)
        if len(self.asked) >= self._waits:
            self.set()
        return self.is_set()


def test_the_loop_sleeps_until_the_tick_and_survives_failures(app, monkeypatch) -> None:
    # Given a store that fails twice, then a bug, then works
    answers = iter([StoreUnavailable("away"), StoreUnavailable("away"), RuntimeError("bug")])
    real = app.store.server_now
    looks: list[float] = []

    def server_now():
        looks.append(1)
        answer = next(answers, None)
        if answer is not None:
            raise answer
        return real()

    monkeypatch.setattr(app.store, "server_now", server_now)
    stop = StopAfter(waits=5)
    scheduler = Scheduler(app, SchedulerConfig(retry_s=0.01, max_sleep_s=0.5), rng=lambda: 0)
    # When it loops for five sleeps
    scheduler.run(stop)
    # Then it tried again after each failure, then slept max_sleep_s between looks (the next
    # tick is an hour away): one look per sleep, never a polling storm
    assert stop.asked == [0.01, 0.01, 0.01, 0.5, 0.5]
    assert len(looks) == 5


def test_one_schedules_bug_is_logged_and_the_others_still_tick(app, monkeypatch, caplog):
    # Given a second schedule whose look fails with an unexpected error
    @app.periodic(every_s=60)
    def broken() -> None:
        """Its look raises."""

    scheduler = _due_hourly(app)
    real = scheduler._look

    def look(schedule, now):
        if schedule.name == "broken":
            raise OverflowError("date value out of range")
        return real(schedule, now)

    monkeypatch.setattr(scheduler, "_look", look)
    # When the scheduler looks
    with caplog.at_level(logging.ERROR, logger="leaseq.scheduler"):
        scheduler.run_once()
    # Then the hourly tick is enqueued, and the failure is logged with the schedule's name
    assert [j.task for j in app.store.list_jobs("default")] == ["hourly"]
    assert [(r.action, r.schedule) for r in caplog.records] == [("schedule_failed", "broken")]


def _due_hourly(app: leaseq.App) -> Scheduler:
    """The app's hourly schedule registered, with one tick due."""
    _half_past(app)
    scheduler = Scheduler(app, SchedulerConfig(jitter_s=0, max_sleep_s=60))
    scheduler.register()
    advance(app.store, 3600)
    return scheduler


def test_an_advance_lost_to_another_scheduler_is_looked_at_again_at_once(app, monkeypatch):
    # Given a scheduler that plans the due tick, and another that advances the record
    # between that plan and its compare-and-set
    scheduler = _due_hourly(app)
    other = Scheduler(app, SchedulerConfig(jitter_s=0))
    raced: list[bool] = []

    def planned_then_raced(*args, **kwargs):
        advance_planned = plan(*args, **kwargs)
        if not raced:  # the other scheduler's own look goes through here too
            raced.append(True)
            other.run_once()
        return advance_planned

    monkeypatch.setattr(service, "plan", planned_then_raced)
    # When it looks, then: its compare-and-set lost to a record that moved, so it looks again
    # at once (the next look plans from what the winner wrote)
    assert scheduler.run_once() == 0.0


def test_an_advance_the_ledger_refuses_by_itself_is_not_planned_again_at_once(
    app, monkeypatch, caplog
):
    # Given a plan that does not move the cursor forward (a tick before it), which the
    # ledger's compare-and-set refuses without anything else moving the record
    scheduler = _due_hourly(app)
    monkeypatch.setattr(service, "plan", lambda _schedule, state, *_: TickAdvance(
        cursor=state.cursor - timedelta(minutes=40)))
    # When it looks
    with caplog.at_level(logging.ERROR, logger="leaseq.scheduler"):
        wait = scheduler.run_once()
    # Then it waits max_sleep_s, not 0: the next look would plan the same refused advance
    assert wait == 60
    assert [r.action for r in caplog.records] == ["schedule_advance_refused"]


def test_bad_config_is_refused() -> None:
    with pytest.raises(InvalidInput):
        SchedulerConfig(max_sleep_s=0)
    with pytest.raises(InvalidInput):
        SchedulerConfig(retry_s=-1)
