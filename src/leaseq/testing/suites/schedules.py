"""The schedule ledger: exactly one job per (schedule, tick) whatever the number of
schedulers, a purged tick never fires again, catch-up policies after a gap, ticks on the
store's clock only, and the ledger's own primitives (register, change, pause, deactivate)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from leaseq.app import App
from leaseq.errors import ScheduleConflict
from leaseq.ledger import ScheduleEvent, ScheduleState, schedule_journal_id
from leaseq.scheduler.plan import plan
from leaseq.scheduler.service import Scheduler, SchedulerConfig, history, set_paused, trigger
from leaseq.stores.base import Store
from leaseq.testing.harness import FreshStore, advance, events, seconds_until, shifted_clock

HOUR_S = 3600.0
QUEUE = "periodic"

#: A daily tick in a repeated hour (2024 fall-back nights), a registration in its second pass
#: (01:10 EST, 02:10 CET), and the tick that comes next (the next day's, an hour more away).
REPEATED_HOURS = [
    ("America/New_York", "30 1 * * *", datetime(2024, 11, 3, 6, 10, tzinfo=UTC),
     "2024-11-04T06:30:00Z"),
    ("Europe/Berlin", "30 2 * * *", datetime(2024, 10, 27, 1, 10, tzinfo=UTC),
     "2024-10-28T01:30:00Z"),
]


def _app(store: Store, name: str = "hourly", **schedule: Any) -> App:
    app = App(store=store)

    @app.task(queue=QUEUE)
    def report(tick: datetime, region: str = "eu") -> None:
        """A periodic task that takes its tick."""

    app.schedule(name, report, **{"every_s": HOUR_S, **schedule})
    return app


def _app_in(store: Store, queue: str, name: str, also: str | None = None) -> App:
    """An app whose task ``{queue}_task`` runs in ``queue``, with the hourly schedule
    ``name`` of it; ``also``: a second queue it uses."""
    app = App(store=store)
    app.task(lambda: None, name=f"{queue}_task", queue=queue)
    if also is not None:
        app.task(lambda: None, name=f"{also}_task", queue=also)
    app.schedule(name, f"{queue}_task", every_s=HOUR_S)
    return app


def _at_half_past(store: Store) -> datetime:
    """Move the store's clock to 30 minutes past the next whole hour; returns that hour."""
    now = store.server_now()
    hour = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    advance(store, seconds_until(store, hour) + HOUR_S / 2)
    return hour


def _tick_ids(store: Store, prefix: str) -> list[str]:
    return sorted(j.id for j in store.list_jobs(QUEUE, limit=10_000) if j.id.startswith(prefix))


def _state(store: Store, name: str = "hourly") -> ScheduleState:
    state = store.schedule_state(name)
    assert state is not None, f"schedule {name!r} is not in the ledger"
    return state


def _register(app: App) -> Scheduler:
    scheduler = Scheduler(app, SchedulerConfig(jitter_s=0))
    scheduler.register()
    return scheduler


def _retired_at_half_past(store: Store) -> None:
    """An hourly ``catch_up="all"`` schedule "old", registered at half past, then marked
    inactive there by a scheduler of code that declares only "new"."""
    _at_half_past(store)
    _register(_app(store, "old", catch_up="all"))
    _register(_app(store, "new"))


def _race(fresh: FreshStore, schedulers: int, **schedule: Any) -> None:
    """``schedulers`` threads, each with its own connection and scheduler, look at once."""
    barrier = threading.Barrier(schedulers)
    errors: list[BaseException] = []

    def look(store: Store) -> None:
        try:
            scheduler = Scheduler(_app(store, **schedule), SchedulerConfig(jitter_s=0))
            scheduler._registered = True  # registered by the test; only the look races
            barrier.wait(timeout=30)
            scheduler.run_once()
        except BaseException as exc:
            errors.append(exc)

    stores = [fresh.open() for _ in range(schedulers)]
    for store in stores:
        store.time_offset_s = fresh.store.time_offset_s
    threads = [threading.Thread(target=look, args=(s,)) for s in stores]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        for store in stores:
            store.close()
    assert not errors, errors


class ScheduleSuite:
    def test_two_schedulers_racing_on_one_tick_write_one_job(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a registered hourly schedule and two connections that both planned the tick
        store = leaseq_store.store
        hour = _at_half_past(store)
        app = _app(store)
        _register(app)
        advance(store, HOUR_S)
        other = leaseq_store.open()
        try:
            other.time_offset_s = store.time_offset_s
            mine, theirs = store.schedule_state("hourly"), other.schedule_state("hourly")
            assert mine is not None and theirs is not None
            now = store.server_now()
            schedule = app.schedules["hourly"]
            spec_for = Scheduler(app)._spec
            my_plan, their_plan = (plan(schedule, s, now, None, 60,
                                        lambda t: spec_for(schedule, t)) for s in (mine, theirs))
            assert my_plan is not None and their_plan is not None
            # When both compare-and-set the same version
            won = [store.advance_schedule("hourly", mine.version, my_plan),
                   other.advance_schedule("hourly", theirs.version, their_plan)]
        finally:
            other.close()
        # Then one wins, and the tick is one job
        assert sorted(won) == [False, True]
        tick = hour + timedelta(hours=1)
        assert _tick_ids(store, "hourly@") == [schedule.job_id(tick)]
        after = store.schedule_state("hourly")
        assert after is not None and after.version == mine.version + 1

    def test_many_schedulers_looking_at_once_enqueue_each_tick_once(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given an hourly schedule with three missed ticks, caught up in full
        store = leaseq_store.store
        _at_half_past(store)
        _register(_app(store, catch_up="all"))
        advance(store, 3 * HOUR_S)
        # When four schedulers on their own connections look at the same moment
        _race(leaseq_store, schedulers=4, catch_up="all")
        # Then each of the three ticks is one job
        assert len(_tick_ids(store, "hourly@")) == 3
        assert _state(store).version == 1

    def test_a_purged_tick_is_not_enqueued_again(self, leaseq_store: FreshStore) -> None:
        # Given a tick enqueued, its job done and purged by retention
        store = leaseq_store.store
        _at_half_past(store)
        scheduler = _register(_app(store))
        advance(store, HOUR_S)
        scheduler.run_once()
        (job_id,) = _tick_ids(store, "hourly@")
        q = store.queue(QUEUE)
        (job,) = q.claim("w1", lease_s=60)
        q.complete(job, None)
        advance(store, 1)
        assert q.purge({"done": 0}) == 1
        # When schedulers look again at the same moment
        scheduler.run_once()
        Scheduler(_app(store), SchedulerConfig(jitter_s=0)).run_once()
        # Then the tick is not enqueued again
        assert q.get(job_id) is None
        assert _tick_ids(store, "hourly@") == []

    @pytest.mark.parametrize(("catch_up", "max_catch_up", "fired", "missed"), [
        ("skip", 100, 0, 10), ("latest", 100, 1, 9), ("all", 100, 10, 0), ("all", 4, 4, 6)])
    def test_catch_up_after_a_ten_tick_gap(self, leaseq_store: FreshStore, catch_up: str,
                                           max_catch_up: int, fired: int, missed: int) -> None:
        # Given an hourly schedule registered at half past, and ten hours without a scheduler
        store = leaseq_store.store
        hour = _at_half_past(store)
        scheduler = _register(_app(store, catch_up=catch_up, max_catch_up=max_catch_up))
        advance(store, 10 * HOUR_S)
        # When a scheduler looks
        scheduler.run_once()
        # Then the policy's ticks are jobs (the latest ones), and the rest are journaled missed
        ticks = [hour + timedelta(hours=n) for n in range(1, 11)]
        schedule = scheduler.app.schedules["hourly"]
        assert _tick_ids(store, "hourly@") == sorted(schedule.job_id(t)
                                                     for t in ticks[10 - fired:])
        entries = store.journal(QUEUE, schedule_journal_id("hourly"))
        found = [e.data["count"] for e in entries
                 if e.event == ScheduleEvent.TICKS_MISSED and e.data is not None]
        assert found == ([missed] if missed else [])
        assert _state(store).cursor == ticks[-1]

    def test_a_process_clock_off_by_an_hour_makes_the_same_ticks(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given two identical schedules of one app, a tick due on the store's clock
        store = leaseq_store.store
        _at_half_past(store)
        both = _app(store, "ahead")
        both.schedule("behind", "report", every_s=HOUR_S)
        _register(both)
        advance(store, HOUR_S)
        # When one scheduler's process clock is an hour ahead and the other's an hour behind
        # (each looking at one of them, as registered)
        for name, shift in (("ahead", +HOUR_S), ("behind", -HOUR_S)):
            scheduler = Scheduler(_app(store, name), SchedulerConfig(jitter_s=0))
            scheduler._registered = True
            with shifted_clock(shift):
                scheduler.run_once()
        # Then both enqueued the same tick, the one the store's clock says is due
        made = [_tick_ids(store, f"{name}@") for name in ("ahead", "behind")]
        assert [ids[0].split("@")[1] for ids in made if len(ids) == 1] == [
            made[0][0].split("@")[1]] * 2

    def test_a_daily_tick_that_dst_skips_fires_once_right_after_the_jump(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given 03:00 daily in Europe/Kyiv, registered the evening before 2026-03-29, when
        # 03:00 does not exist there (the clocks jump from 03:00 to 04:00)
        store = leaseq_store.store
        advance(store, seconds_until(store, datetime(2026, 3, 28, 20, tzinfo=UTC)))
        scheduler = _register(_app(store, "nightly", every_s=None, cron="0 3 * * *",
                                   timezone="Europe/Kyiv"))
        # When schedulers look through the night, every half hour
        for _ in range(16):
            advance(store, HOUR_S / 2)
            scheduler.run_once()
        # Then it fired once, at 04:00+03 (01:00 UTC)
        assert _tick_ids(store, "nightly@") == ["nightly@2026-03-29T01:00:00Z"]

    @pytest.mark.parametrize("catch_up", ["latest", "all"])
    @pytest.mark.parametrize(("zone", "cron", "registered", "first_tick"), REPEATED_HOURS)
    def test_a_daily_tick_registered_in_the_second_pass_of_a_repeated_hour_waits_a_day(
        self, leaseq_store: FreshStore, zone: str, cron: str, registered: datetime,
        first_tick: str, catch_up: str
    ) -> None:
        # Given a daily tick in the hour the clocks repeat, registered during its second
        # pass: that day's tick already passed, in the first pass, before the registration
        store = leaseq_store.store
        advance(store, seconds_until(store, registered))
        scheduler = _register(_app(store, "nightly", every_s=None, cron=cron, timezone=zone,
                                   catch_up=catch_up))
        # When schedulers look every half hour through the next day
        waits = []
        for _ in range(50):
            waits.append(scheduler.run_once())
            advance(store, HOUR_S / 2)
        # Then every look waited (none spun on a refused advance), and only the next day's
        # tick fired: no tick from before the registration, no miss journaled
        assert min(waits) > 0
        assert _tick_ids(store, "nightly@") == [f"nightly@{first_tick}"]
        entries = store.journal(QUEUE, schedule_journal_id("nightly"))
        assert events(entries) == [ScheduleEvent.REGISTERED]

    def test_the_tick_reaches_the_task_as_an_aware_datetime(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a tick enqueued for a task with a tick parameter, in Europe/Kyiv
        store = leaseq_store.store
        hour = _at_half_past(store)
        app = _app(store, timezone="Europe/Kyiv")
        scheduler = _register(app)
        advance(store, HOUR_S)
        scheduler.run_once()
        (job_id,) = _tick_ids(store, "hourly@")
        job = store.get(QUEUE, job_id)
        assert job is not None
        # When the worker builds the call
        arguments = app.tasks["report"].arguments(job)
        # Then the tick is the UTC instant, shown in the schedule's zone
        tick = arguments["tick"]
        assert tick == hour + timedelta(hours=1) and tick.utcoffset() is not None
        assert tick.utcoffset() in (timedelta(hours=2), timedelta(hours=3))
        assert set(arguments) == {"tick"}


class ScheduleLedgerSuite:
    def test_register_is_journaled_once_and_changes_are_named(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a schedule registered twice with the same spec, then with a new payload
        store = leaseq_store.store
        first = _register(_app(store))
        first.register()
        before = _state(store)
        _register(_app(store, payload={"region": "us"}))
        # Then the ledger says so, naming the changed field and never the payload's value
        after = _state(store)
        assert after.version == before.version + 1
        assert after.cursor == before.cursor
        entries = store.journal(QUEUE, schedule_journal_id("hourly"))
        assert events(entries) == [ScheduleEvent.REGISTERED, ScheduleEvent.CHANGED]
        data = entries[1].data
        assert data is not None and data["changed"] == ["payload"]
        assert "us" not in str(entries[1].data)

    def test_a_schedule_gone_from_the_code_stays_inactive_and_never_fires(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a schedule in the ledger that the new code no longer declares
        store = leaseq_store.store
        _at_half_past(store)
        _register(_app(store, "old"))
        scheduler = _register(_app(store, "new"))
        advance(store, HOUR_S)
        # When a scheduler of the new code looks
        scheduler.run_once()
        # Then the old one is kept, inactive, and not fired
        states = {s.name: s for s in store.schedules()}
        assert sorted(states) == ["new", "old"]
        assert not states["old"].active and states["new"].active
        assert _tick_ids(store, "old@") == [] and len(_tick_ids(store, "new@")) == 1
        assert ScheduleEvent.INACTIVE in events(store.journal(QUEUE, schedule_journal_id("old")))
        # and a scheduler of code that declares it again makes it active at its next look
        revived = Scheduler(_app(store, "old"), SchedulerConfig(jitter_s=0))
        revived._registered = True  # as one started before the other code deactivated it
        revived.run_once()
        assert _state(store, "old").active

    def test_a_schedule_declared_again_skips_the_ticks_it_was_gone(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given an hourly catch_up="all" schedule that code without it marked inactive
        store = leaseq_store.store
        _retired_at_half_past(store)
        # When code that declares it again starts three hours later, and looks
        advance(store, 3 * HOUR_S)
        back = _register(_app(store, "old", catch_up="all"))
        back.run_once()
        # Then the ticks of its absence never fire (as a pause's); the next one does
        assert _state(store, "old").active and _tick_ids(store, "old@") == []
        advance(store, HOUR_S)
        back.run_once()
        assert len(_tick_ids(store, "old@")) == 1

    def test_a_schedule_retired_for_minutes_by_a_rolling_deploy_keeps_its_ticks(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given an hourly schedule that a scheduler of other code (a rolling deploy's old
        # one) marked inactive at half past
        store = leaseq_store.store
        _retired_at_half_past(store)
        # When the code that declares it looks again 40 minutes later, past the hour
        advance(store, 40 * 60)
        back = _register(_app(store, "old", catch_up="all"))
        back.run_once()
        # Then the tick of the hour still fires: an absence shorter than REVIVE_GRACE_S
        # keeps the cursor
        assert _state(store, "old").active and len(_tick_ids(store, "old@")) == 1

    @pytest.mark.parametrize("action", ["trigger", "pause_resume"])
    def test_an_operator_action_on_a_retired_schedule_keeps_its_retirement_clock(
        self, leaseq_store: FreshStore, action: str
    ) -> None:
        # Given an hourly catch_up="all" schedule retired at half past, on which an operator
        # triggers a manual job (or pauses and resumes it) ten hours later
        store = leaseq_store.store
        _retired_at_half_past(store)
        advance(store, 10 * HOUR_S)
        if action == "trigger":
            trigger(store, "old")
        else:
            set_paused(store, "old", True)
            set_paused(store, "old", False)
        # When code that declares it again looks 30 minutes after that
        advance(store, HOUR_S / 2)
        back = _register(_app(store, "old", catch_up="all"))
        back.run_once()
        # Then none of the gap fires: it has been retired for more than REVIVE_GRACE_S,
        # whatever the operator did meanwhile
        assert _state(store, "old").active
        assert [j for j in _tick_ids(store, "old@") if "@manual-" not in j] == []

    def test_a_name_active_in_another_apps_queue_is_refused_and_left_alone(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given app "billing" whose schedule "cleanup" ticks in its queue, and app "mail",
        # on the same store, that declares a schedule of that name in its own queue
        store = leaseq_store.store
        _at_half_past(store)
        billing = _register(_app_in(store, "billing", "cleanup"))
        before = _state(store, "cleanup")
        mail = _register(_app_in(store, "mail", "cleanup"))
        # When mail registers it in the ledger, then both schedulers look an hour later
        with pytest.raises(ScheduleConflict, match=r"'billing'.*schedule_name"):
            store.register_schedule("cleanup", "mail", before.spec_json, ["mail"])
        advance(store, HOUR_S)
        mail.run_once()
        billing.run_once()
        # Then the record is billing's as it was, and its tick went to billing with its task
        after = _state(store, "cleanup")
        assert (after.queue, after.spec_json, after.version) == (
            "billing", before.spec_json, before.version + 1)  # + 1: billing's advance
        assert store.list_jobs("mail") == []
        assert [j.task for j in store.list_jobs("billing")] == ["billing_task"]

    def test_a_schedule_moves_between_its_apps_queues_and_takes_an_inactive_record(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a schedule in queue "a" of an app that uses queues "a" and "b"
        store = leaseq_store.store
        _register(_app_in(store, "a", "moving", also="b"))
        # When the app declares it in "b", its record moves there
        assert _register(_app_in(store, "b", "moving", also="a")) is not None
        assert _state(store, "moving").queue == "b"
        # and when code without it retires it, another app may take the name
        store.deactivate_schedules(["a", "b"], [])
        taken = store.register_schedule("moving", "c", _state(store, "moving").spec_json)
        assert (taken.queue, taken.active) == ("c", True)

    def test_history_gathers_a_schedules_journal_from_each_queue_it_was_in(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a schedule registered in queue "a" (which holds no job), moved to "b" a
        # minute later, and paused there a minute after that
        store = leaseq_store.store
        _register(_app_in(store, "a", "moving", also="b"))
        advance(store, 60)
        _register(_app_in(store, "b", "moving", also="a"))
        advance(store, 60)
        set_paused(store, "moving", True)
        assert "a" not in store.queues()
        # When its history is read
        entries = history(store, "moving")
        # Then it has the entries of both queues, oldest first, the move naming its origin
        assert events(entries) == [ScheduleEvent.REGISTERED, ScheduleEvent.CHANGED,
                                   ScheduleEvent.PAUSED]
        assert entries[1].data is not None and entries[1].data["from_queue"] == "a"

    def test_the_newest_code_retires_a_schedule_an_old_scheduler_revived(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a rolling deploy: a scheduler of old code that declares "old", started
        # first, and one of new code without it, whose start marked it inactive
        store = leaseq_store.store
        _at_half_past(store)
        old = _register(_app(store, "old"))
        new = _register(_app(store, "new"))
        new.run_once()
        # When the old one looks (reactivating it), then stops, and the new one runs on
        old.run_once()
        assert _state(store, "old").active
        advance(store, SchedulerConfig().retire_s)
        new.run_once()
        # Then the new code's word stands: inactive, never fired again
        assert not _state(store, "old").active
        advance(store, 3 * HOUR_S)
        new.run_once()
        assert not _state(store, "old").active and _tick_ids(store, "old@") == []

    def test_pause_stops_ticks_and_resume_skips_the_paused_ones(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a paused schedule through three ticks
        store = leaseq_store.store
        _at_half_past(store)
        scheduler = _register(_app(store, catch_up="all"))
        state = store.schedule_state("hourly")
        assert set_paused(store, "hourly", True) is True
        assert set_paused(store, "hourly", True) is False
        advance(store, 3 * HOUR_S)
        scheduler.run_once()
        assert _tick_ids(store, "hourly@") == []
        # When it is resumed, and a scheduler looks again then and an hour later
        assert set_paused(store, "hourly", False) is True
        scheduler.run_once()
        advance(store, HOUR_S)
        scheduler.run_once()
        # Then only the tick after the resume fired; an advance planned before is refused
        assert len(_tick_ids(store, "hourly@")) == 1
        assert state is not None
        assert store.advance_schedule("hourly", state.version, _stale_advance(state)) is False
        assert events(store.journal(QUEUE, schedule_journal_id("hourly")))[-2:] == [
            ScheduleEvent.PAUSED, ScheduleEvent.RESUMED]

    def test_overlap_skip_journals_the_tick_while_the_last_job_is_live(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a schedule that skips overlapping ticks, its first job still pending
        store = leaseq_store.store
        _at_half_past(store)
        scheduler = _register(_app(store, overlap="skip"))
        advance(store, HOUR_S)
        scheduler.run_once()
        (first,) = _tick_ids(store, "hourly@")
        # When the next tick comes
        advance(store, HOUR_S)
        scheduler.run_once()
        # Then it is skipped, counted and journaled with the job that was running
        assert _tick_ids(store, "hourly@") == [first]
        assert _state(store).skipped == 1
        (skip,) = [e for e in store.journal(QUEUE, schedule_journal_id("hourly"))
                   if e.event == ScheduleEvent.TICK_SKIPPED]
        assert skip.data is not None and skip.data["running"] == first

    def test_trigger_enqueues_one_manual_job_and_leaves_the_cursor(
        self, leaseq_store: FreshStore
    ) -> None:
        store = leaseq_store.store
        _register(_app(store))
        before = _state(store)
        job_id = trigger(store, "hourly")
        assert "@manual-" in job_id and store.get(QUEUE, job_id) is not None
        assert _state(store).cursor == before.cursor
        assert ScheduleEvent.TICK_MANUAL in events(
            store.journal(QUEUE, schedule_journal_id("hourly")))

    def test_a_manual_job_has_the_tasks_priority_and_overlap_skip_waits_for_it(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a schedule that skips overlapping ticks, of a task of priority 7
        store = leaseq_store.store
        _at_half_past(store)
        app = App(store=store)
        app.task(lambda: None, name="urgent", queue=QUEUE, priority=7)
        app.schedule("hourly", "urgent", every_s=HOUR_S, overlap="skip")
        scheduler = _register(app)
        # When an operator triggers it, and its tick comes while that job is still pending
        job_id = trigger(store, "hourly")
        advance(store, HOUR_S)
        scheduler.run_once()
        # Then the manual job has the task's priority, and the tick was skipped for it
        job = store.get(QUEUE, job_id)
        assert job is not None and job.priority == 7
        assert _tick_ids(store, "hourly@2") == [] and _state(store).skipped == 1
        assert _state(store).last_job_id == job_id


def _stale_advance(state: Any) -> Any:
    from leaseq.ledger import TickAdvance

    return TickAdvance(cursor=state.cursor + timedelta(seconds=1))


__all__ = ["UTC", "ScheduleLedgerSuite", "ScheduleSuite"]
