"""The schedule ledger's records: what a store keeps per schedule, and one advance of it.

The ledger is separate from the jobs on purpose: a retention purge deletes old jobs, never
a schedule's cursor, so a purged tick's job is never enqueued again (docs/periodic.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from leaseq.errors import ScheduleConflict
from leaseq.job import JobSpec

# The schedule's journal events live with the job's (leaseq.journal); imported from here too.
from leaseq.journal import ScheduleEvent as ScheduleEvent

#: A schedule back in the code within this long of being marked inactive (a rolling deploy,
#: whose old and new schedulers disagree for minutes) keeps its cursor: the ticks it missed
#: fire as its ``catch_up`` says. Gone longer, it starts from now, as a resume does.
REVIVE_GRACE_S = 3600.0


def format_tick(tick: datetime) -> str:
    """A tick as an ISO 8601 UTC instant, milliseconds only when there are some."""
    utc = tick.astimezone(UTC)
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    if utc.microsecond:
        text += f".{utc.microsecond // 1000:03d}"
    return text + "Z"


def spec_changes(old_json: str, new_json: str) -> list[str]:
    """The spec fields that differ between two ledger specs (journaled; never the values:
    the payload may hold what the journal must not)."""
    try:
        old = json.loads(old_json)
    except ValueError:
        old = {}
    new = json.loads(new_json)
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


#: The ``schedule_changed`` data key naming the queue a move took the schedule from: its
#: entries before the move are in that queue's journal (``leaseq schedules history``).
FROM_QUEUE = "from_queue"


def schedule_changes(old: Mapping[str, Any], queue: str, spec_json: str) -> dict[str, Any]:
    """The journal data of a ``schedule_changed``: which fields changed (from a ledger row or
    document with ``spec``, ``queue`` and ``active``), whether it was inactive, and the queue
    it moved from, if it did."""
    changed = spec_changes(old["spec"], spec_json)
    moved = {}
    if old["queue"] != queue:
        changed.append("queue")
        moved = {FROM_QUEUE: old["queue"]}
    return {"changed": changed, "reactivated": not old["active"], **moved}


def owned(state: ScheduleState, queue: str) -> ScheduleState:
    """``state`` after a registration into ``queue``: a record left in another queue was
    refused to the registrar (``register_schedule``), so the schedule is another app's."""
    if state.queue != queue:
        raise ScheduleConflict(state.name, state.queue)
    return state


def schedule_journal_id(name: str) -> str:
    """The journal id a schedule's own events are written under, in the schedule's queue."""
    return f"schedule:{name}"


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """One schedule's ledger record.

    ``cursor``: every tick at or before it is decided (enqueued, skipped or missed); the
    scheduler looks only after it. ``version`` is the compare-and-set token: +1 on every
    advance. ``spec_json`` is the schedule as the code last registered it (what ``leaseq
    schedules`` shows and ``trigger`` enqueues). ``intent`` (stores without transactions):
    the ticks whose jobs an advance promised and that may not be written yet.
    """

    name: str
    queue: str
    spec_json: str
    cursor: datetime
    version: int
    last_tick: datetime | None = None
    last_job_id: str | None = None
    skipped: int = 0
    paused: bool = False
    active: bool = True
    updated_at: datetime | None = None
    intent: tuple[tuple[datetime, JobSpec], ...] = ()

    @property
    def ticking(self) -> bool:
        """Whether its ticks fire: declared (active) and not paused. A paused or inactive
        schedule has no next tick and no lag until it is resumed or declared again."""
        return self.active and not self.paused


@dataclass(frozen=True, slots=True)
class TickAdvance:
    """One compare-and-set of a schedule's cursor, with what it decided for each due tick.

    ``jobs``: ``(tick, spec)`` to enqueue (idempotent by the spec's id), in tick order.
    ``skipped``: ticks not enqueued because the previous job was still live (``overlap=
    "skip"``), each journaled ``tick_skipped``; ``running``: that live job. ``missed``: how
    many ticks the catch-up policy dropped, from ``missed_first`` to ``missed_last``,
    journaled once as ``ticks_missed``.
    """

    cursor: datetime
    jobs: Sequence[tuple[datetime, JobSpec]] = ()
    skipped: Sequence[datetime] = ()
    running: str | None = None
    missed: int = 0
    missed_first: datetime | None = None
    missed_last: datetime | None = None
    # Derived: the tick and job the ledger shows as the last one enqueued.
    last: tuple[datetime, str] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.jobs:
            tick, spec = self.jobs[-1]
            object.__setattr__(self, "last", (tick, spec.job_id))

    def journal(self) -> list[tuple[str, str, dict[str, Any]]]:
        """``(event, reason, data)`` for the schedule's journal: each skipped tick, then the
        missed ones as one entry. Never the payload."""
        entries: list[tuple[str, str, dict[str, Any]]] = [(ScheduleEvent.TICK_SKIPPED.value,
                    f"overlap: tick {format_tick(tick)} skipped, {self.running} still live",
                    {"tick": format_tick(tick), "running": self.running})
                   for tick in self.skipped]
        if self.missed:
            ends = self.missed_first, self.missed_last
            # both set when missed is: the plan takes all three from one Due
            first, last = map(format_tick, ends)  # type: ignore[arg-type]
            entries.append((ScheduleEvent.TICKS_MISSED.value,
                            f"catch-up policy dropped {self.missed} tick(s), {first} to {last}",
                            {"count": self.missed, "first": first, "last": last}))
        return entries
