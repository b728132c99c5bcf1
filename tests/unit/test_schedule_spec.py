"""Schedules as declared: validation, when they tick (DST in a real zone, per cronsim), the
catch-up plan, and what ``@app.periodic`` / ``app.schedule`` register."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

import leaseq
from leaseq.app import PayloadMismatch
from leaseq.errors import InvalidInput
from leaseq.job import JobSpec
from leaseq.ledger import ScheduleState, format_tick
from leaseq.scheduler import spec
from leaseq.scheduler.plan import plan
from leaseq.scheduler.spec import MAX_EVERY_S, Schedule

KYIV = ZoneInfo("Europe/Kyiv")


def kyiv(*args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=KYIV, fold=fold)  # type: ignore[misc]


def ticks(schedule: Schedule, after: datetime, until: datetime) -> list[datetime]:
    return schedule.due(after.astimezone(UTC), until.astimezone(UTC), 10_000).ticks


def cron(expr: str, zone: str = "Europe/Kyiv", **options: object) -> Schedule:
    return Schedule("s", "t", "q", cron=expr, timezone=zone, **options)  # type: ignore[arg-type]


# --- DST, in a real zone (Europe/Kyiv: 2026-03-29 03:00 → 04:00, 2026-10-25 04:00 → 03:00) ---


def test_spring_forward_a_fixed_time_that_does_not_exist_fires_once_right_after_the_jump():
    # Given 03:00 every day, and the night 03:00 does not exist in Kyiv
    found = ticks(cron("0 3 * * *"), kyiv(2026, 3, 28, 12), kyiv(2026, 3, 30, 12))
    # Then it fires once that night, at 04:00+03 (01:00 UTC), and at 03:00 the next day
    assert [t.astimezone(KYIV).isoformat() for t in found] == [
        "2026-03-29T04:00:00+03:00", "2026-03-30T03:00:00+03:00"]
    assert format_tick(found[0]) == "2026-03-29T01:00:00Z"


def test_spring_forward_an_every_30_minutes_schedule_skips_the_missing_hour():
    found = ticks(cron("*/30 * * * *"), kyiv(2026, 3, 29, 2, 15), kyiv(2026, 3, 29, 4, 45))
    assert [t.astimezone(KYIV).strftime("%H:%M%z") for t in found] == [
        "02:30+0200", "04:00+0300", "04:30+0300"]


def test_fall_back_a_fixed_time_in_the_repeated_hour_fires_once():
    found = ticks(cron("30 3 * * *"), kyiv(2026, 10, 24, 12), kyiv(2026, 10, 26, 12))
    assert [t.astimezone(KYIV).isoformat() for t in found] == [
        "2026-10-25T03:30:00+03:00", "2026-10-26T03:30:00+02:00"]


def test_fall_back_an_every_30_minutes_schedule_fires_in_both_hours():
    found = ticks(cron("*/30 * * * *"), kyiv(2026, 10, 25, 2, 45), kyiv(2026, 10, 25, 4, 15))
    assert [t.astimezone(KYIV).strftime("%H:%M%z") for t in found] == [
        "03:00+0300", "03:30+0300", "03:00+0200", "03:30+0200", "04:00+0200"]
    assert len({t for t in found}) == len(found)  # distinct instants, distinct job ids


def test_a_cursor_inside_the_second_pass_of_the_repeated_hour_resumes_there():
    # Given a cursor at 03:10 in the second 03:00 hour (+02:00)
    cursor = kyiv(2026, 10, 25, 3, 10, fold=1)
    # Then the next 30-minute tick is 03:30+02, not a replay of the first pass
    nxt = cron("*/30 * * * *").next_after(cursor.astimezone(UTC))
    assert nxt.astimezone(KYIV).isoformat() == "2026-10-25T03:30:00+02:00"


def test_every_s_ticks_are_epoch_aligned_utc_instants_whatever_the_zone():
    schedule = Schedule("s", "t", "q", every_s=3600, timezone="Europe/Kyiv")
    found = ticks(schedule, kyiv(2026, 3, 29, 2, 30), kyiv(2026, 3, 29, 5, 30))
    assert [format_tick(t) for t in found] == [
        "2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z"]


def test_six_fields_read_seconds_first():
    found = ticks(cron("*/20 * * * * *", "UTC"), datetime(2026, 1, 1, tzinfo=UTC),
                  datetime(2026, 1, 1, 0, 1, tzinfo=UTC))
    assert [t.second for t in found] == [20, 40, 0]


NEW_YORK = ZoneInfo("America/New_York")


@pytest.mark.parametrize(("expr", "after", "expected"), [
    # spring forward (02:00 EST → 03:00 EDT on 2024-03-10): once, right after the jump
    ("0 30 2 * * *", datetime(2024, 3, 10, 6, tzinfo=UTC),
     ["2024-03-10T03:00:00-04:00", "2024-03-11T02:30:00-04:00"]),
    ("15 30 2 * * *", datetime(2024, 3, 10, 6, tzinfo=UTC),
     ["2024-03-10T03:00:15-04:00", "2024-03-11T02:30:15-04:00"]),
    # fall back (02:00 EDT → 01:00 EST on 2024-11-03): once, in the first pass
    ("0 30 1 * * *", datetime(2024, 11, 3, 4, tzinfo=UTC),
     ["2024-11-03T01:30:00-04:00", "2024-11-04T01:30:00-05:00"]),
    ("0,30 30 1 * * *", datetime(2024, 11, 3, 4, tzinfo=UTC),
     ["2024-11-03T01:30:00-04:00", "2024-11-03T01:30:30-04:00",
      "2024-11-04T01:30:00-05:00", "2024-11-04T01:30:30-05:00"]),
])
def test_six_fields_at_a_fixed_time_follow_debian_cron_across_dst(expr, after, expected):
    found = ticks(cron(expr, "America/New_York"), after, after + timedelta(days=1, hours=3))
    assert [t.astimezone(NEW_YORK).isoformat() for t in found] == expected


def test_six_fields_keep_a_second_after_a_cursor_inside_its_minute():
    # Given a cursor at 03:00:10 and a tick at 03:00:20 each day
    schedule = cron("20 0 3 * * *", "UTC")
    # Then the tick 10 s later is the next one, not tomorrow's
    assert schedule.next_after(datetime(2026, 1, 1, 3, 0, 10, tzinfo=UTC)) == datetime(
        2026, 1, 1, 3, 0, 20, tzinfo=UTC)


# --- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize("options", [
    {"cron": "0 3 * * *", "every_s": 60}, {}, {"cron": "61 * * * *"},
    {"cron": "0 3 * * *", "timezone": "Mars/Olympus"}, {"every_s": 0.5},
    {"every_s": float("nan")}, {"every_s": True}, {"every_s": 1e12},
    {"every_s": float("inf")}, {"every_s": MAX_EVERY_S + 1}, {"every_s": 60, "catch_up": "some"},
    {"every_s": 60, "overlap": "queue"}, {"every_s": 60, "max_catch_up": 0},
    {"every_s": 60, "payload": []}, {"every_s": 60, "takes_tick": True,
                                     "payload": {"tick": 1}},
])
def test_bad_schedules_are_refused_with_a_typed_error(options):
    with pytest.raises(InvalidInput):
        Schedule("s", "t", "q", **options)  # type: ignore[arg-type]


def test_the_longest_every_s_computes_its_ticks():
    schedule = Schedule("s", "t", "q", every_s=MAX_EVERY_S)
    assert schedule.next_after(datetime(2026, 1, 1, tzinfo=UTC)).year == 2070


def test_a_bad_name_is_refused():
    with pytest.raises(InvalidInput):
        Schedule("bad name", "t", "q", every_s=60)


def test_the_ledger_spec_round_trips_and_describes_itself():
    schedule = cron("0 3 * * *", catch_up="all", payload={"a": 1})
    again = Schedule.from_ledger("s", "q", schedule.spec_json())
    assert again == schedule and again.describe() == "cron 0 3 * * *"
    assert Schedule("s", "t", "q", every_s=1.5).describe() == "every 1.5 s"
    assert format_tick(datetime(2026, 1, 1, 0, 0, 1, 500_000, tzinfo=UTC)) == \
        "2026-01-01T00:00:01.500Z"


# --- the plan --------------------------------------------------------------------------------


def _state(cursor: datetime) -> ScheduleState:
    return ScheduleState("s", "q", "{}", cursor, 0)


def _spec(tick: datetime) -> JobSpec:
    return JobSpec(f"s@{format_tick(tick)}", {}, "{}")


T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_nothing_due_plans_nothing():
    schedule = Schedule("s", "t", "q", every_s=60)
    assert plan(schedule, _state(T0), T0 + timedelta(seconds=59), None, 60, _spec) is None


def test_skip_fires_a_tick_found_on_time_and_drops_a_late_one():
    schedule = Schedule("s", "t", "q", every_s=3600, catch_up="skip")
    on_time = plan(schedule, _state(T0), T0 + timedelta(hours=1, seconds=2), None, 60, _spec)
    late = plan(schedule, _state(T0), T0 + timedelta(hours=1, minutes=5), None, 60, _spec)
    assert [t for t, _ in on_time.jobs] == [T0 + timedelta(hours=1)]  # type: ignore[union-attr]
    assert late.jobs == [] and late.missed == 1  # type: ignore[union-attr]
    assert late.cursor == T0 + timedelta(hours=1)  # type: ignore[union-attr]


def test_overlap_skip_enqueues_one_of_a_catch_up_and_skips_the_rest():
    schedule = Schedule("s", "t", "q", every_s=60, catch_up="all", overlap="skip")
    advance = plan(schedule, _state(T0), T0 + timedelta(minutes=3), None, 60, _spec)
    assert len(advance.jobs) == 1 and len(advance.skipped) == 2  # type: ignore[union-attr]
    assert advance.running == advance.jobs[0][1].job_id  # type: ignore[union-attr]
    busy = plan(schedule, _state(T0), T0 + timedelta(minutes=1), "s@x", 60, _spec)
    assert busy.jobs == [] and busy.running == "s@x"  # type: ignore[union-attr]
    assert busy.journal()[0][0] == "tick_skipped"  # type: ignore[union-attr]


def test_a_cron_catch_up_counts_every_dropped_tick():
    schedule = cron("* * * * *", "UTC", catch_up="all", max_catch_up=2)
    advance = plan(schedule, _state(T0), T0 + timedelta(minutes=10, seconds=5), None, 60,
                   _spec)
    assert [t.minute for t, _ in advance.jobs] == [9, 10]  # type: ignore[union-attr]
    assert (advance.missed, advance.missed_first.minute,  # type: ignore[union-attr]
            advance.missed_last.minute) == (8, 1, 8)  # type: ignore[union-attr]


# --- the app ---------------------------------------------------------------------------------


def test_periodic_registers_the_task_with_its_options_and_the_schedule(tmp_path):
    app = leaseq.App(f"sqlite:///{tmp_path}/a.db")

    @app.periodic(cron="0 3 * * *", timezone="Europe/Kyiv", catch_up="latest",
                  queue="reports", max_attempts=2, lease_s=120)
    def nightly_report(job: leaseq.Job, tick: datetime) -> None:
        """Nightly."""

    schedule = app.schedules["nightly_report"]
    assert app.tasks["nightly_report"] is nightly_report and nightly_report.takes_tick
    assert (schedule.queue, schedule.max_attempts, schedule.takes_tick) == ("reports", 2, True)
    assert nightly_report.policy.lease_s == 120


def test_schedule_checks_the_payload_and_refuses_a_second_name(tmp_path):
    app = leaseq.App(f"sqlite:///{tmp_path}/a.db")

    @app.task
    def sync_drive(drive: str) -> None:
        """Sync."""

    app.schedule("sync-drive", sync_drive, every_s=300, payload={"drive": "main"})
    assert not sync_drive.takes_tick
    with pytest.raises(InvalidInput):
        app.schedule("sync-drive", sync_drive, every_s=300, payload={"drive": "main"})
    with pytest.raises(PayloadMismatch):
        app.schedule("other", sync_drive, every_s=300)
    with pytest.raises(InvalidInput):
        app.schedule("nope", "missing", every_s=300)
    for payload in ("ab", 5, [("drive", "main")]):  # a mapping only, refused with a type
        with pytest.raises(InvalidInput, match="payload must be a mapping"):
            app.schedule("odd", sync_drive, every_s=300, payload=payload)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):  # not JSON: refused when declared, not at every tick
        app.schedule("set", sync_drive, every_s=300, payload={"drive": {"a"}})


def test_a_worker_that_never_imports_the_schedule_passes_the_tick_as_a_datetime(tmp_path):
    # Given the app of a process that declares the schedule, and the app of a worker that
    # imports the task alone (the schedule is declared in another module)
    url = f"sqlite:///{tmp_path}/a.db"
    got: list[object] = []

    def tasks(app: leaseq.App) -> None:
        @app.task(name="beat")
        def beat(tick: datetime) -> None:
            got.append(tick)

        @app.task(name="label")
        def label(tick: str) -> None:  # a tick as text, where the function asks for text
            got.append(tick)

    declaring, worker_app = leaseq.App(url), leaseq.App(url)
    tasks(declaring)
    tasks(worker_app)
    at = datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    q = declaring.queue("default")
    for name in ("beat", "label"):
        schedule = declaring.schedule(name, name, every_s=3600, timezone="Europe/Kyiv")
        q.enqueue_many([schedule.job_spec(q, schedule.job_id(at), at)])
    # When the worker runs the tick jobs
    from leaseq.worker import Worker, WorkerConfig
    Worker(worker_app, WorkerConfig(burst=True, concurrency=1, idle_max_s=0.05)).run()
    # Then the tick arrives as the aware datetime the schedule fired at, in its zone, and as
    # text to the function that asks for text
    assert got == [at.astimezone(KYIV), "2026-03-29T04:00:00+03:00"]
    assert isinstance(got[0], datetime) and got[0].utcoffset() == timedelta(hours=3)


@pytest.mark.parametrize("spec_json", ["{}", "[]", "not json", '{"task": "t", "cron": "x"}',
                                       '{"task": "t", "every_s": "often"}'])
def test_a_ledger_spec_this_code_cannot_read_is_invalid_input(spec_json):
    # What lists a ledger (leaseq schedules, the dashboard, the gauges) shows the rest
    with pytest.raises(InvalidInput, match="schedule 'odd'"):
        Schedule.from_ledger("odd", "q", spec_json)


# --- zones that depend on the host, and a cron that is not text ----------------------------


@pytest.mark.parametrize("zone", [
    "localtime", "posixrules", "Factory", "posix/Europe/Kyiv", "right/UTC"])
def test_a_zone_the_host_resolves_its_own_way_is_refused(zone):
    with pytest.raises(InvalidInput, match="depends on the host"):
        cron("0 3 * * *", zone)


@pytest.mark.parametrize("zone", ["UTC", "Etc/UTC", "Europe/Kyiv", "America/New_York"])
def test_iana_zones_are_taken(zone):
    assert cron("0 3 * * *", zone).timezone == zone


def test_the_tz_database_is_scanned_once(monkeypatch):
    # Given a count of the tz database's scans, from a fresh cache
    scans: list[int] = []
    real = zoneinfo.available_timezones

    def counted() -> set[str]:
        scans.append(1)
        return real()

    monkeypatch.setattr(zoneinfo, "available_timezones", counted)
    spec.known_zones.cache_clear()
    try:
        # When three schedules are declared
        for zone in ("UTC", "Europe/Kyiv", "Asia/Tokyo"):
            cron("0 3 * * *", zone)
    finally:
        spec.known_zones.cache_clear()
    # Then the database was read once
    assert scans == [1]


@pytest.mark.parametrize("expr", [123, ["0", "3", "*", "*", "*"], 3.5])
def test_a_cron_that_is_not_text_is_refused_with_a_typed_error(expr):
    with pytest.raises(InvalidInput, match="cron must be a string"):
        Schedule("s", "t", "q", cron=expr)


def test_skip_fires_only_the_latest_due_tick_even_when_an_earlier_one_is_on_time():
    # Given every 10 s, found 25 s after the cursor: ticks 15 s and 5 s late, both on time
    skip = Schedule("s", "t", "q", every_s=10, catch_up="skip")
    latest = Schedule("s", "t", "q", every_s=10, catch_up="latest")
    now = T0 + timedelta(seconds=25)
    on_time = plan(skip, _state(T0), now, None, 60, _spec)
    # Then skip fires the latest one only, as latest does: it never fires more than latest
    assert on_time is not None and [t for t, _ in on_time.jobs] == [T0 + timedelta(seconds=20)]
    assert on_time.missed == 1
    by_latest = plan(latest, _state(T0), now, None, 60, _spec)
    assert by_latest is not None and on_time.jobs == by_latest.jobs
