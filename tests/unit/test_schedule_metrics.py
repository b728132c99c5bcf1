"""The schedule gauges' values (``leaseq_schedule_last_tick_timestamp``,
``leaseq_schedule_lag_seconds``) for a ledger built tick by tick on the store's clock."""

from __future__ import annotations

from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry

import leaseq
from leaseq.ledger import TickAdvance
from leaseq.metrics import Metrics, ScheduleCollector
from leaseq.scheduler.spec import Schedule
from leaseq.testing.harness import advance, seconds_until

HOUR = timedelta(hours=1)


def _hourly(store: leaseq.Store, name: str) -> Schedule:
    schedule = Schedule(name=name, task="report", queue="reports", every_s=3600)
    store.register_schedule(name, schedule.queue, schedule.spec_json())
    return schedule


def _gauges(store: leaseq.Store) -> dict[tuple[str, str], float]:
    metrics = Metrics()
    metrics.watch_schedules(store)
    return {(s.name, s.labels["schedule"]): s.value
            for family in metrics.registry.collect() for s in family.samples
            if s.name.startswith("leaseq_schedule_")}


def test_the_gauges_show_each_schedules_last_tick_and_lag(
    store: leaseq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given four hourly schedules registered at half past an hour H (their cursor)
    hour = store.server_now().replace(minute=0, second=0, microsecond=0) + HOUR
    advance(store, seconds_until(store, hour) + 1800)
    ticked = _hourly(store, "ticked")
    for name in ("late", "paused", "gone"):
        _hourly(store, name)
    # And "ticked" has enqueued its tick H+1, "paused" is paused, "gone" left the code
    state = store.schedule_state("ticked")
    assert state is not None
    tick = hour + HOUR
    spec = store.queue("reports").spec(ticked.job_id(tick), {}, task="report")
    assert store.advance_schedule("ticked", state.version, TickAdvance(tick, [(tick, spec)]))
    assert store.pause_schedule("paused", True)
    assert store.deactivate_schedules(["reports"], ["ticked", "late", "paused"]) == ["gone"]
    # When Prometheus scrapes at H+1:10 on the store's clock
    now = tick + timedelta(minutes=10)
    monkeypatch.setattr(store, "server_now", lambda: now)
    gauges = _gauges(store)
    # Then "ticked" shows its tick and no lag (its next tick, H+2, is not due); "late" is
    # 10 minutes behind its tick H+1 and shows no last tick; "paused" and "gone" are never
    # late: their series stay, at 0
    assert gauges == {
        ("leaseq_schedule_last_tick_timestamp", "ticked"): tick.timestamp(),
        ("leaseq_schedule_lag_seconds", "ticked"): 0.0,
        ("leaseq_schedule_lag_seconds", "late"): 600.0,
        ("leaseq_schedule_lag_seconds", "paused"): 0.0,
        ("leaseq_schedule_lag_seconds", "gone"): 0.0,
    }


def test_an_inactive_schedule_reads_0_however_long_it_has_been_gone(
    store: leaseq.Store
) -> None:
    # Given an hourly schedule gone from the code, its ticks due for three hours now
    _hourly(store, "gone")
    store.deactivate_schedules(["reports"], [])
    advance(store, 3 * 3600)
    # When Prometheus scrapes
    gauges = _gauges(store)
    # Then its lag reads 0, as docs/periodic.md says, not a vanished series
    assert gauges == {("leaseq_schedule_lag_seconds", "gone"): 0.0}


def test_the_gauges_are_empty_without_a_schedule(store: leaseq.Store) -> None:
    assert _gauges(store) == {}


def test_the_ledger_is_read_once_per_refresh_and_the_lag_grows_between_reads(
    store: leaseq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an hourly schedule 10 minutes late, its gauges on a clock the test moves
    hour = store.server_now().replace(minute=0, second=0, microsecond=0) + HOUR
    advance(store, seconds_until(store, hour) + 1800)
    _hourly(store, "late")
    advance(store, 40 * 60)
    reads = []
    schedules = store.schedules
    monkeypatch.setattr(store, "schedules", lambda: reads.append(1) or schedules())
    now = [0.0]
    registry = CollectorRegistry()
    registry.register(ScheduleCollector(store, refresh_s=5, clock=lambda: now[0]))
    lag = lambda: registry.get_sample_value(  # noqa: E731
        "leaseq_schedule_lag_seconds", {"schedule": "late"})
    first = lag()
    # When it is scraped again 3 s later, then 6 s after the first scrape
    now[0] = 3.0
    again = lag()
    now[0] = 6.0
    lag()
    # Then the ledger was read by the first and the third scrape only, and the second one's
    # lag is the first's plus the 3 s that passed
    assert first is not None and first >= 600.0
    assert again == pytest.approx(first + 3.0)
    assert len(reads) == 2


def test_the_up_gauge_says_whether_the_ledger_could_be_read(
    store: leaseq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the schedule gauges of a store with a schedule, on a clock the test moves
    _hourly(store, "beat")
    now = [0.0]
    registry = CollectorRegistry()
    registry.register(ScheduleCollector(store, refresh_s=5, clock=lambda: now[0]))
    # When the ledger is read, Then the gauge reads 1
    assert registry.get_sample_value("leaseq_schedules_up") == 1
    # And when the next read fails (the store went away), it reads 0, though the last lag is
    # still served until it is stale
    def unreadable() -> None:
        raise leaseq.StoreUnavailable("the store went away")

    monkeypatch.setattr(store, "schedules", unreadable)
    now[0] = 6.0
    assert registry.get_sample_value("leaseq_schedules_up") == 0
    assert registry.get_sample_value("leaseq_schedule_lag_seconds", {"schedule": "beat"}) == 0


def test_the_scheduler_commands_metrics_serve_the_schedule_gauges_and_their_up_gauge(
    store: leaseq.Store
) -> None:
    # Given what `leaseq scheduler --metrics-port` serves, on a free port
    import httpx

    from leaseq.cli.schedules import _serve_metrics

    _hourly(store, "beat")
    server = _serve_metrics(store, 0)
    try:
        # When Prometheus scrapes it
        scraped = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    finally:
        server()
    # Then it has the ledger's up gauge beside the schedule's lag
    assert "leaseq_schedules_up 1.0" in scraped
    assert 'leaseq_schedule_lag_seconds{schedule="beat"}' in scraped
