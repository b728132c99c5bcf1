"""Ticks across the 2024 daylight-saving transitions of America/New_York and Europe/Berlin,
with the cursor walked minute by minute through each: every tick after a cursor is after it,
the ticks strictly increase, and a cursor anywhere resumes the walk from before the
transition (nothing replayed, nothing lost). A tick at or before the cursor is what once
made a scheduler re-plan an advance the compare-and-set refuses, every ~25 ms."""

from __future__ import annotations

import bisect
import itertools
from datetime import UTC, datetime, timedelta

import pytest

from leaseq.job import JobSpec
from leaseq.ledger import ScheduleState, format_tick
from leaseq.scheduler.plan import plan
from leaseq.scheduler.spec import Schedule

#: (zone, the transition's UTC instant): spring forward, then fall back.
TRANSITIONS = [
    ("America/New_York", datetime(2024, 3, 10, 7, tzinfo=UTC)),   # 02:00 EST → 03:00 EDT
    ("America/New_York", datetime(2024, 11, 3, 6, tzinfo=UTC)),   # 02:00 EDT → 01:00 EST
    ("Europe/Berlin", datetime(2024, 3, 31, 1, tzinfo=UTC)),      # 02:00 CET → 03:00 CEST
    ("Europe/Berlin", datetime(2024, 10, 27, 1, tzinfo=UTC)),     # 03:00 CEST → 02:00 CET
]
#: Fixed times in the skipped or repeated hour of either zone (01:xx New York, 02:xx
#: Berlin), an hour range across it, wildcards, and six fields (seconds first).
CRON_SPECS = ["30 1 * * *", "30 2 * * *", "0 2 * * *", "0 3 * * *", "15,45 1-3 * * *",
              "*/15 * * * *", "0 * * * *", "*/20 1 * * *", "30 */20 * * * *"]
WALK = timedelta(hours=3)
TICKS_PER_CURSOR = 3


def _cursors(transition: datetime) -> list[datetime]:
    """Every minute from ``WALK`` before the transition to ``WALK`` after it."""
    minutes = int(2 * WALK / timedelta(minutes=1))
    return [transition - WALK + timedelta(minutes=m) for m in range(minutes + 1)]


def _first(schedule: Schedule, cursor: datetime, count: int) -> list[datetime]:
    return list(itertools.islice(schedule.ticks_after(cursor), count))


def _walk(schedule: Schedule, transition: datetime) -> list[datetime]:
    """The ticks from an hour before the window to three days after it (a daily schedule's
    next three ticks from any cursor in it)."""
    end = transition + WALK + timedelta(days=3)
    ticks = schedule.ticks_after(transition - WALK - timedelta(hours=1))
    return list(itertools.takewhile(lambda t: t <= end, ticks))


def _after(walk: list[datetime], cursor: datetime, count: int) -> list[datetime]:
    return walk[bisect.bisect_right(walk, cursor):][:count]


@pytest.mark.parametrize("expr", CRON_SPECS)
@pytest.mark.parametrize(("zone", "transition"), TRANSITIONS)
def test_cron_ticks_after_any_cursor_across_dst_are_after_it_and_increase(
    zone: str, transition: datetime, expr: str
) -> None:
    # Given a cron schedule and the walk of its ticks from before the transition
    schedule = Schedule("s", "t", "q", cron=expr, timezone=zone)
    walk = _walk(schedule, transition)
    for cursor in _cursors(transition):
        # When a scheduler asks for the ticks after a cursor in that window
        found = _first(schedule, cursor, TICKS_PER_CURSOR)
        # Then each is after the cursor, they strictly increase, and they are the walk's
        assert found[0] > cursor, f"{expr} in {zone}: {found[0]} not after {cursor}"
        assert all(a < b for a, b in itertools.pairwise(found)), found
        assert found == _after(walk, cursor, TICKS_PER_CURSOR), cursor


@pytest.mark.parametrize(("zone", "transition"), TRANSITIONS)
@pytest.mark.parametrize("every_s", [900, 3600])
def test_every_s_ticks_across_dst_are_epoch_aligned_whatever_the_zone(
    zone: str, transition: datetime, every_s: int
) -> None:
    schedule = Schedule("s", "t", "q", every_s=every_s, timezone=zone)
    step = timedelta(seconds=every_s)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    for cursor in _cursors(transition):
        first = epoch + ((cursor - epoch) // step + 1) * step
        assert _first(schedule, cursor, 3) == [first, first + step, first + 2 * step]


def _spec(tick: datetime) -> JobSpec:
    return JobSpec(f"s@{format_tick(tick)}", {}, "{}")


@pytest.mark.parametrize("expr", CRON_SPECS)
@pytest.mark.parametrize(("zone", "transition"), TRANSITIONS)
def test_a_plan_from_any_cursor_across_dst_moves_the_cursor_and_fires_only_after_it(
    zone: str, transition: datetime, expr: str
) -> None:
    # Given a schedule that catches up two ticks, its cursor anywhere in the window, looked
    # at on the third tick after it (two fire, one is dropped and journaled as missed)
    schedule = Schedule("s", "t", "q", cron=expr, timezone=zone, catch_up="all",
                        max_catch_up=2)
    walk = _walk(schedule, transition)
    for cursor in _cursors(transition):
        due = _after(walk, cursor, 3)
        state = ScheduleState("s", "q", "{}", cursor, 0)
        # When the scheduler plans the due ticks
        advance = plan(schedule, state, due[-1], None, 60, _spec)
        # Then the advance moves the cursor to the last due tick (the compare-and-set
        # accepts only a move), fires only ticks after the cursor, and a miss it journals
        # is after the cursor too
        assert advance is not None and advance.cursor == due[-1], f"{expr} at {cursor}"
        assert [tick for tick, _ in advance.jobs] == due[1:], cursor
        assert (advance.missed, advance.missed_first) == (1, due[0]), cursor
