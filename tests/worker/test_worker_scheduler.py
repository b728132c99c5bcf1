"""Every worker runs the scheduler of its app's schedules by default; ``scheduler=False``
(``--no-scheduler``) opts out. The exactly-once argument itself is tested in the conformance
suite (ScheduleSuite) and the chaos scenario ``periodic``."""

from __future__ import annotations

from datetime import datetime

from prometheus_client import generate_latest
from worker_helpers import running, wait_until

import leaseq


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
