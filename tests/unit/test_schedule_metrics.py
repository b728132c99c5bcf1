"""The schedule gauges' values (``leaseq_schedule_last_tick_timestamp``,
``leaseq_schedule_lag_seconds``) for a ledger built tick by tick on the store's clock."""

from __future__ import annotations

from datetime import timedelta

import pytest

import leaseq
from leaseq.ledger import TickAdvance
from leaseq.metrics import Metrics
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
