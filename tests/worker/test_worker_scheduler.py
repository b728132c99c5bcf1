"""Every worker runs the scheduler of its app's schedules by default; ``scheduler=False``
(``--no-scheduler``) opts out. The exactly-once argument itself is tested in the conformance
suite (ScheduleSuite) and the chaos scenario ``periodic``."""

from __future__ import annotations

from datetime import datetime

from prometheus_client import generate_latest
from worker_helpers import running, wait_until

import leaseq
from leaseq.scheduler import Scheduler
from leaseq.worker import Worker, WorkerConfig


def _every_second(app: leaseq.App, seen: list[datetime]) -> None:
    @app.periodic(every_s=1, queue="work", catch_up="all")
    def beat(tick: datetime) -> None:
        seen.append(tick)


def test_a_worker_runs_the_schedule_and_the_task_gets_its_tick(app: leaseq.App) -> None:
    # Given an every-second schedule
    seen: list[datetime] = []
    _every_second(app, seen)
    # When a worker runs for two ticks
    with running(app, idle_max_s=0.05) as worker:
        wait_until(lambda: len(seen) >= 2, what="two ticks run")
        scraped = generate_latest(worker.metrics.registry).decode()
    # Then each tick ran once with its tick, an aware datetime, and the gauges are served
    assert len(set(seen)) == len(seen) and all(t.tzinfo is not None for t in seen)
    assert 'leaseq_schedule_last_tick_timestamp{schedule="beat"}' in scraped
    assert 'leaseq_schedule_lag_seconds{schedule="beat"}' in scraped


def test_a_worker_without_the_scheduler_leaves_the_ledger_alone(app: leaseq.App) -> None:
    seen: list[datetime] = []
    _every_second(app, seen)

    @app.task(queue="work")
    def other() -> None:
        """Something to claim meanwhile."""

    with running(app, idle_max_s=0.05, scheduler=False):
        other.enqueue()
        wait_until(lambda: app.store.counts("work").get("done") == 1, what="one job done")
    assert app.store.schedules() == [] and seen == []


def test_a_worker_without_the_scheduler_still_serves_the_schedule_gauges(
        app: leaseq.App) -> None:
    # Given an app's schedule in the ledger, registered by a scheduler running elsewhere
    _every_second(app, [])
    Scheduler(app).register()
    # When a worker of the app runs without the scheduler (--no-scheduler)
    worker = Worker(app, WorkerConfig(scheduler=False))
    scraped = generate_latest(worker.metrics.registry).decode()
    # Then its metrics serve the schedule's gauges: they read the ledger, as any process may
    assert 'leaseq_schedule_lag_seconds{schedule="beat"}' in scraped


def test_a_worker_of_an_app_without_schedules_leaves_another_apps_schedules_active(
        app: leaseq.App) -> None:
    # Given a scheduler's app that declares a schedule in queue "work"
    scheduling = leaseq.App(store=app.store)
    scheduling.task(lambda: None, name="report", queue="work")
    scheduling.schedule("hourly", "report", every_s=3600)
    Scheduler(scheduling).register()
    # And the workers' app, which declares the task and no schedule (a common arrangement:
    # the schedules live in the scheduler's module only)
    app.task(lambda: None, name="report", queue="work")
    # When a worker of it runs a job
    app.queue("work").enqueue("j", {}, task="report")
    with running(app, idle_max_s=0.05):
        wait_until(lambda: app.store.counts("work").get("done") == 1, what="the job done")
    # Then the schedule stays active: retiring it would make its scheduler revive it from
    # now at each look, dropping the ticks in between (`leaseq scheduler` of an app without
    # schedules is how its last one is retired)
    assert _active(app, "hourly")


def _active(app: leaseq.App, name: str) -> bool:
    state = app.store.schedule_state(name)
    assert state is not None
    return state.active
