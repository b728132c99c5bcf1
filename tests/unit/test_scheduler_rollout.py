"""Two versions of the code on one ledger (a rolling deploy): each scheduler writes its own
spec again every ``retire_s`` where the ledger's differs, so the newest code's stands once
the old code is gone, and while both run no tick fires twice."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

import leaseq
from leaseq.ledger import ScheduleEvent, ScheduleState, schedule_journal_id
from leaseq.scheduler import Scheduler, SchedulerConfig
from leaseq.scheduler.service import trigger
from leaseq.stores.base import Store
from leaseq.testing.harness import advance, seconds_until

RETIRE_S = SchedulerConfig().retire_s


@pytest.fixture
def store(tmp_path):
    store = leaseq.connect(f"sqlite:///{tmp_path}/s.db")
    yield store
    store.close()


def _scheduler(store: Store, region: str, every_s: float = 3600) -> Scheduler:
    """A scheduler of the code version whose hourly "report" schedule has ``region``."""
    app = leaseq.App(store=store)

    @app.task(queue="q")
    def report(region: str) -> None:
        """A report of one region."""

    app.schedule("report", report, every_s=every_s, payload={"region": region})
    return Scheduler(app, SchedulerConfig(jitter_s=0))


def _at_half_past(store: Store) -> None:
    now = store.server_now()
    hour = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    advance(store, seconds_until(store, hour) + 1800)


def _state(store: Store) -> ScheduleState:
    state = store.schedule_state("report")
    assert state is not None
    return state


def _changes(store: Store) -> int:
    return sum(1 for e in store.journal("q", schedule_journal_id("report"))
               if e.event == ScheduleEvent.CHANGED)


def test_the_newest_codes_spec_stands_in_the_ledger_once_the_old_code_is_gone(store):
    # Given new code's scheduler running, and one of old code that registers its own spec
    # once (a pod restarted mid-deploy), then is gone
    _at_half_past(store)
    new = _scheduler(store, "new")
    new.run_once()
    _scheduler(store, "old", every_s=60).register()
    assert json.loads(_state(store).spec_json)["payload"] == {"region": "old"}
    changes = _changes(store)
    # When the new code runs on for retire_s
    advance(store, RETIRE_S)
    new.run_once()
    # Then the ledger holds its spec again, journaled, and a manual tick enqueues with it
    assert _state(store).spec_json == new.app.schedules["report"].spec_json()
    assert _changes(store) == changes + 1
    assert store.get("q", trigger(store, "report")).payload == {"region": "new"}
    # And the next pass, finding nothing different, writes nothing
    version = _state(store).version
    advance(store, RETIRE_S)
    new.run_once()
    assert (_state(store).version, _changes(store)) == (version, changes + 1)


def test_two_versions_running_at_once_fire_each_tick_once_and_rewrite_seldom(store):
    # Given an old and a new scheduler that disagree on the payload, both running
    _at_half_past(store)
    old, new = _scheduler(store, "old"), _scheduler(store, "new")
    old.run_once()
    new.run_once()
    before = _changes(store)
    # When both look every 30 s for three hours
    looks = 3 * 3600 // 30
    for _ in range(looks):
        advance(store, 30)
        old.run_once()
        new.run_once()
    # Then each of the three ticks is one job, and the ledger's spec was rewritten at most
    # once per retire_s per scheduler, not at each look
    ids = [j.id for j in store.list_jobs("q", limit=100)]
    assert len(ids) == len(set(ids)) == 3
    assert 0 < _changes(store) - before <= 2 * (3 * 3600 / RETIRE_S)
