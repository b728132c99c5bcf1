"""How the commands show what they found: rich tables for people, plain rows for ``--json``, and
a job's journal told as a story."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from leaseq.job import Job, JournalEntry
from leaseq.journal import RENAMED_EVENTS, JournalEvent
from leaseq.ledger import FROM_QUEUE
from leaseq.metrics import QueueSnapshot
from leaseq.timeline import read_timeline

STATUS_COLUMNS = ["pending", "processing", "done", "failed", "cancelled"]

#: Control characters but line feed and tab (C0, DEL, C1): an ESC in an error text could
#: retitle, clear or recolour the operator's terminal, or fake a line of output.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


#: How wide the tables may grow when printed to a pipe or a file (``leaseq status | cat``, a CI
#: log): rich's default there, 80 columns, cut queue names and headers short.
PIPE_WIDTH = 240


def console() -> Console:
    """Where a command prints its tables: the terminal's width on a terminal; on a pipe or a
    file, ``$COLUMNS`` when set, else ``PIPE_WIDTH``."""
    out = Console()
    if out.is_terminal or "COLUMNS" in os.environ:
        return out
    return Console(width=PIPE_WIDTH)


def shown(text: str) -> str:
    """Text from a store (ids, tasks, errors, reasons) as a command prints it: rich markup
    escaped, and each control character but line feed and tab written as ``\\xNN``."""
    return escape(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text))

#: How the story tells an event; an event not listed is told by its name. Rows written under
#: an older name (``RENAMED_EVENTS``) are told as the event they mean today.
EVENT_WORDS: dict[str, str] = {
    JournalEvent.ENQUEUED: "enqueued",
    JournalEvent.CLAIMED: "claimed",
    JournalEvent.HEARTBEAT_LOST: "lost its lease",
    JournalEvent.RESULT_SAVED: "finished",
    JournalEvent.RETRY_SCHEDULED: "will be retried",
    JournalEvent.SNOOZED: "snoozed",
    JournalEvent.QUARANTINED: "quarantined",
    JournalEvent.RECLAIMED: "lease expired, back in the queue",
    JournalEvent.REQUEUED: "requeued by an operator",
    JournalEvent.CANCELLED: "cancelled",
    JournalEvent.PUBLISHED: "published",
    JournalEvent.RECEIVED: "delivered",
    JournalEvent.ACK_SENT: "acknowledged",
    JournalEvent.GIVEN_BACK: "given back, ready at once",
    JournalEvent.PUBLISH_OWED: "publish owed again",
}


def event_words(event: str) -> str:
    """The story's words for ``event``, under its name today or an older one."""
    return EVENT_WORDS.get(RENAMED_EVENTS.get(event, event), event)


# --- status ----------------------------------------------------------------------------------


def status_rows(snaps: Sequence[QueueSnapshot]) -> dict[str, Any]:
    return {s.queue: {"counts": s.counts, "ready": s.ready, "in_flight": s.in_flight,
                      "held_back": {"by_key": s.held_back.by_key,
                                    "by_rate": s.held_back.by_rate},
                      "oldest_pending_age_s": round(s.oldest_pending_age_s, 3)} for s in snaps}


def status_table(url: str, snaps: Sequence[QueueSnapshot]) -> Table:
    table = Table(title=f"leaseq — {shown(url)}")
    others = sorted({k for s in snaps for k in s.counts} - set(STATUS_COLUMNS))
    limited = any(s.held_back.total for s in snaps)
    held = ["held by key", "held by rate"] if limited else []
    for column in ["queue", *STATUS_COLUMNS, *others, "ready", *held, "in flight",
                   "oldest pending"]:
        table.add_column(column, justify="left" if column == "queue" else "right")
    for s in snaps:
        held_cells = [str(s.held_back.by_key), str(s.held_back.by_rate)] if limited else []
        counts = [str(s.counts.get(k, 0)) for k in [*STATUS_COLUMNS, *others]]
        table.add_row(shown(s.queue), *counts, str(s.ready), *held_cells, str(s.in_flight),
                      f"{s.oldest_pending_age_s:.1f} s")
    return table


# --- the quarantine --------------------------------------------------------------------------


def quarantine_rows(jobs: Sequence[Job]) -> list[dict[str, Any]]:
    return [{"queue": j.queue, "job_id": j.id, "task": j.task, "failure": j.failure,
             "attempts": j.attempts, "error": j.error,
             "updated_at": j.updated_at.isoformat() if j.updated_at else None} for j in jobs]


def quarantine_table(jobs: Sequence[Job]) -> Table:
    table = Table(title=f"quarantine: {len(jobs)} job(s)")
    for column in ("queue", "job", "task", "reason", "attempts", "error"):
        table.add_column(column, overflow="fold")
    for j in jobs:
        last_line = (j.error or "").strip().splitlines()[-1:] or [""]
        table.add_row(shown(j.queue), shown(j.id), shown(j.task or ""), j.failure or "",
                      str(j.attempts), shown(last_line[0][:200]))
    return table


# --- one job ---------------------------------------------------------------------------------


#: Record fields shown even when zero: the budget a job has spent.
ALWAYS_SHOWN = ("status", "attempts", "snoozes", "givebacks")


def record_table(job: Job) -> Table:
    """The job's record; the payload only as its size and keys (it may hold anything)."""
    table = Table(show_header=False, title=f"job {shown(job.id)}", title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for name, value in job.to_dict().items():
        if name == "payload":
            value = f"{len(json.dumps(value))} bytes, keys: {', '.join(sorted(value)) or '-'}"
        if value not in (None, "", False) or name in ALWAYS_SHOWN:
            text = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value
            table.add_row(name, shown(str(text)))
    return table


def story(entries: Sequence[JournalEntry], now: datetime | None = None) -> list[str]:
    """The journal, one line per event, timed from the first; the wait for the first claim and
    how long each attempt ran beside the rows they were measured to (``leaseq.timeline``), and
    ``running for`` an attempt still open when given ``now``."""
    start = entries[0].at if entries else None
    notes = read_timeline(entries).notes(now)
    return [story_line(entry, start, notes.get(index))
            for index, entry in enumerate(entries)]


def story_line(entry: JournalEntry, start: datetime | None, note: str | None = None) -> str:
    offset = (entry.at - start).total_seconds() if start else 0.0
    words = event_words(entry.event)
    parts = [f"{entry.at:%H:%M:%S.%f}"[:-3], f"+{offset:7.3f}s", f"[bold]{words}[/bold]"]
    if entry.attempt:
        parts.append(f"attempt {entry.attempt}")
    if entry.worker_id:
        parts.append(f"by {shown(entry.worker_id)}")
    detail = entry.reason or ""
    if entry.data and "delay_s" in entry.data:
        detail += f" (in {float(entry.data['delay_s']):.2f} s)"
    if detail:
        parts.append(f"— {shown(detail)}")
    if note:
        parts.append(f"· {note}")
    return "  ".join(parts)


def schedule_story(entries: Sequence[JournalEntry]) -> list[str]:
    """A schedule's journal, one line per event at its full UTC date and time: unlike a job's,
    it spans months, so a time of day or an offset from the first entry says little."""
    return [schedule_line(entry) for entry in entries]


def schedule_line(entry: JournalEntry) -> str:
    at = entry.at.astimezone(UTC)
    parts = [f"{at:%Y-%m-%d %H:%M:%S}.{at.microsecond // 1000:03d}Z",
             f"[bold]{shown(entry.event)}[/bold]"]
    if entry.reason:
        parts.append(f"— {shown(entry.reason)}")
    data = entry.data or {}
    if "changed" in data:
        parts.append(f"changed: {shown(', '.join(map(str, data['changed'])) or 'nothing')}")
    if data.get(FROM_QUEUE):
        parts.append(f"from queue {shown(str(data[FROM_QUEUE]))}")
    if data.get("reactivated"):
        parts.append("reactivated")
    return "  ".join(parts)


def attempt_rows(entries: Sequence[JournalEntry], now: datetime | None = None) -> dict[str, Any]:
    """``--json``'s reading of the journal: the wait for the first claim, and each attempt."""
    timeline = read_timeline(entries)
    return {"waited_s": timeline.waited_s, "attempts": [
        {"attempt": a.number, "lease_epoch": a.lease_epoch, "worker_id": a.worker_id,
         "claimed_at": a.claimed_at.isoformat(),
         "ended_at": a.ended_at.isoformat() if a.ended_at else None,
         "ended_by": a.ended_by, "reason": a.reason, "ran_s": a.ran_s(now)}
        for a in timeline.attempts]}
