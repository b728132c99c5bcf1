"""A job's journal read as attempts: who held each, how long it ran and how it ended, and how
long the job waited for its first claim. Pure: the dashboard's job page and ``leaseq inspect``
both read the journal through it.

An attempt runs from a ``claimed`` row to the first row that ends it (``ENDINGS``) or, when
none came, to the next claim: a job is claimed while another attempt is open only when that
attempt's lease ran out and the job was taken again. So an attempt whose lease was lost is
measured to when the journal saw it end (a reclaim, the next claim), which can be later than
the moment its worker stopped. Times are the journal's, written by the server clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from leaseq.job import JournalEntry
from leaseq.journal import JournalEvent

#: The events that end the open attempt: its outcome, or the news that its lease is gone.
ENDINGS = frozenset({
    JournalEvent.RESULT_SAVED, JournalEvent.RETRY_SCHEDULED, JournalEvent.SNOOZED,
    JournalEvent.GIVEN_BACK, JournalEvent.QUARANTINED, JournalEvent.HEARTBEAT_LOST,
    JournalEvent.RECLAIMED, JournalEvent.CANCELLED, JournalEvent.LEASE_ABANDONED})
#: How an attempt ended when the next claim ended it.
TAKEN_AGAIN = "lease ran out; claimed again"


@dataclass(frozen=True)
class Attempt:
    """One claim of the job, to the row that ended it (``None`` while it runs).
    ``claim_index`` / ``end_index`` are the positions of those rows in the journal read."""

    number: int | None
    lease_epoch: int | None
    worker_id: str | None
    claimed_at: datetime
    claim_index: int
    ended_at: datetime | None = None
    end_index: int | None = None
    ended_by: str | None = None
    reason: str | None = None

    @property
    def running(self) -> bool:
        return self.ended_at is None

    def ran_s(self, now: datetime | None = None) -> float | None:
        """Claim to end; while it runs, claim to ``now`` (None without one)."""
        end = self.ended_at or now
        return None if end is None else _seconds(self.claimed_at, end)


@dataclass(frozen=True)
class Timeline:
    """The attempts in claim order, and the wait from the first enqueue to the first claim
    (None when the journal holds no enqueue before a claim, or no claim yet)."""

    attempts: tuple[Attempt, ...]
    waited_s: float | None
    first_claim_index: int | None

    def notes(self, now: datetime | None = None) -> dict[int, str]:
        """A duration to show beside a journal row, by its position: the wait on the first
        claim, how long an attempt ran on the row that ended it, and ``running for`` on the
        claim of an attempt still open (given ``now``)."""
        notes: dict[int, list[str]] = {}
        if self.waited_s is not None and self.first_claim_index is not None:
            notes.setdefault(self.first_claim_index, []).append(
                f"waited {format_duration(self.waited_s)}")
        for attempt in self.attempts:
            ran = attempt.ran_s(now)
            if attempt.end_index is not None and ran is not None:
                notes.setdefault(attempt.end_index, []).append(
                    f"{_name(attempt)} ran {format_duration(ran)}")
            elif ran is not None:
                notes.setdefault(attempt.claim_index, []).append(
                    f"running for {format_duration(ran)}")
        return {index: "; ".join(words) for index, words in notes.items()}


def read_timeline(entries: Sequence[JournalEntry]) -> Timeline:
    """The attempts in ``entries`` (one job's journal, oldest first)."""
    attempts: list[Attempt] = []
    enqueued_at: datetime | None = None
    waited_s: float | None = None
    first_claim: int | None = None
    for index, entry in enumerate(entries):
        open_ = attempts[-1] if attempts and attempts[-1].running else None
        if entry.event == JournalEvent.ENQUEUED and enqueued_at is None:
            enqueued_at = entry.at
        elif entry.event == JournalEvent.CLAIMED:
            if open_ is not None:
                attempts[-1] = _ended(open_, entry, index, TAKEN_AGAIN)
            if first_claim is None:
                first_claim = index
                waited_s = None if enqueued_at is None else _seconds(enqueued_at, entry.at)
            attempts.append(Attempt(entry.attempt, entry.lease_epoch, entry.worker_id,
                                    entry.at, index))
        elif entry.event in ENDINGS and open_ is not None and _same_lease(open_, entry):
            attempts[-1] = _ended(open_, entry, index, entry.reason)
    return Timeline(tuple(attempts), waited_s, first_claim)


def format_duration(seconds: float) -> str:
    """``0.049 s``, ``12.3 s``, ``4 min 05 s``, ``2 h 03 min``, ``3 d 04 h``."""
    s = max(0.0, seconds)
    if s < 10:
        return f"{s:.3f} s"
    if s < 60:
        return f"{s:.1f} s"
    whole = int(s)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
    return f"{whole // 86400} d {whole % 86400 // 3600:02d} h"


def _ended(attempt: Attempt, entry: JournalEntry, index: int, reason: str | None) -> Attempt:
    return replace(attempt, ended_at=entry.at, end_index=index, ended_by=entry.event,
                   reason=reason)


def _same_lease(attempt: Attempt, entry: JournalEntry) -> bool:
    # A worker that lost its lease may report it (heartbeat_lost) after the next claim: that
    # row names the old epoch and must not end the attempt now running.
    return None in (attempt.lease_epoch, entry.lease_epoch) or \
        attempt.lease_epoch == entry.lease_epoch


def _name(attempt: Attempt) -> str:
    return f"attempt {attempt.number}" if attempt.number is not None else "the attempt"


def _seconds(start: datetime, end: datetime) -> float:
    # Rows come in journal order; on a server whose clock stepped back, never a negative time.
    return max(0.0, (end - start).total_seconds())
