"""What one look at a schedule decides: which due ticks to enqueue, skip or drop.

A pure function of the ledger record, the database's now and the previous job's liveness, so
every scheduler that looks at the same record at the same moment decides the same advance,
and the compare-and-set lets exactly one of them write it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from leaseq.job import JobSpec
from leaseq.ledger import ScheduleState, TickAdvance
from leaseq.scheduler.spec import Due, Schedule


def plan(schedule: Schedule, state: ScheduleState, now: datetime, running: str | None,
         on_time_s: float, spec_for: Callable[[datetime], JobSpec]) -> TickAdvance | None:
    """The advance for the ticks in (``state.cursor``, ``now``]; None when none is due.

    ``running``: the schedule's previous job when it is still pending or processing (only
    looked up for ``overlap="skip"``). ``on_time_s``: with ``catch_up="skip"``, how late the
    latest due tick may be and still fire (a scheduler wakes a moment after the tick it slept
    for, never exactly at it); the ticks before it are dropped, so ``skip`` never fires more
    than ``latest`` would.
    """
    keep = schedule.max_catch_up if schedule.catch_up == "all" else 1
    due = schedule.due(state.cursor, now, keep)
    if not due.ticks:
        return None
    if schedule.catch_up == "skip" and now - due.ticks[-1] > timedelta(seconds=on_time_s):
        due = Due([], due.dropped + 1, due.first_dropped or due.ticks[0], due.ticks[-1])
    fire, skip = _split_overlap(schedule, due.ticks, running)
    jobs = [(tick, spec_for(tick)) for tick in fire]
    if skip and running is None:
        running = jobs[0][1].job_id
    return TickAdvance(
        cursor=max([*due.ticks[-1:], due.last_dropped or state.cursor]),
        jobs=jobs, skipped=skip, running=running if skip else None, missed=due.dropped,
        missed_first=due.first_dropped, missed_last=due.last_dropped)


def _split_overlap(schedule: Schedule, ticks: list[datetime], running: str | None
                   ) -> tuple[list[datetime], list[datetime]]:
    """With ``overlap="skip"`` at most one job is live: none while ``running`` is, and after
    one is enqueued here the later ticks of this advance would overlap it."""
    if schedule.overlap == "allow":
        return ticks, []
    if running is not None:
        return [], ticks
    return ticks[:1], ticks[1:]
