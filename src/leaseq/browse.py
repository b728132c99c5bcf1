"""Named records of the store primitives an operator's tools read through: the filtered job
page, the bulk action on a counted snapshot, journal counts per hour and the worker registry
(DESIGN.md §8). The dashboard and ``leaseq doctor`` use nothing else.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from leaseq import validate
from leaseq.errors import InvalidInput
from leaseq.job import Job
from leaseq.journal import BY_ACTOR, JournalEvent

#: The most rows one page query walks before it stops and says so (``JobPage.capped``):
#: filters no index bounds (error text, a task beside a status, a time range beside a task)
#: are checked on at most this many rows per page, whatever the table's size.
SCAN_CAP = 20_000
#: ...and for at most this long: a walk past it stops between two reads, as at the row cap.
SCAN_TIME_S = 0.25
#: The most ids one bulk snapshot holds; a larger match is refused, to be narrowed first.
SNAPSHOT_MAX = 100_000
#: How many jobs one bulk statement changes (one transaction per batch).
BULK_BATCH = 500
#: Above this many jobs a status's count is not counted to the end: the overview and doctor
#: show "10,000+" (or, on PostgreSQL, the planner's estimate), so their cost stays bounded
#: however large the table grows.
COUNT_CAP = 10_000
#: The statuses the overview counts (an app's own terminal statuses are left to the jobs page).
SUMMARY_STATUSES = ("pending", "processing", "done", "failed", "cancelled")
#: The longest error text a filter may search for, and the longest operator name journaled.
MAX_SEARCH_CHARS = 200
MAX_ACTOR_CHARS = 100
BAD_CURSOR = "not a page cursor this store gave"


class BulkAction(StrEnum):
    """What an operator may do to a set of jobs; each acts only on the states it fits."""

    REQUEUE = "requeue"  # a terminal job (failed, cancelled, done, app terminal) → pending
    CANCEL = "cancel"  # pending, processing or failed → cancelled
    DELETE = "delete"  # a terminal job → removed (its journal keeps a ``deleted`` event)


#: The journal event each action writes, with the operator's name as its reason.
ACTION_EVENTS = {BulkAction.REQUEUE: JournalEvent.REQUEUED,
                 BulkAction.CANCEL: JournalEvent.CANCELLED, BulkAction.DELETE: JournalEvent.DELETED}


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs of one queue to show. Every field but ``queue`` is optional; ``updated_*``
    bound ``updated_at`` (from inclusive, until exclusive; a datetime without a time zone is
    taken as UTC, on every store); ``error_text`` matches a case-insensitive substring of the
    last error."""

    queue: str
    status: str | None = None
    task: str | None = None
    id_prefix: str | None = None
    error_text: str | None = None
    updated_from: datetime | None = None
    updated_until: datetime | None = None

    def __post_init__(self) -> None:
        validate.queue_name(self.queue)
        if self.status:
            validate.status_name(self.status)
        for name, most in (("task", 200), ("id_prefix", validate.MAX_JOB_ID_BYTES),
                           ("error_text", MAX_SEARCH_CHARS)):
            value = getattr(self, name)
            if value is not None and not validate.text_field(value, most, empty=True):
                raise InvalidInput(f"{name} to search for must be text of at most {most} "
                                   "characters, valid Unicode without NUL")
        for name in ("status", "task", "id_prefix", "error_text"):
            if getattr(self, name) == "":
                object.__setattr__(self, name, None)
        for name in ("updated_from", "updated_until"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, datetime):
                raise InvalidInput(f"{name} must be a datetime, got {type(value).__name__}")
            if value is not None and value.tzinfo is None:
                object.__setattr__(self, name, value.replace(tzinfo=UTC))

    @property
    def order(self) -> str:
        """``"recent"`` (newest ``updated_at`` first) with a status, else ``"id"``: the order
        the index that bounds the filter gives for free."""
        return "recent" if self.status else "id"


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: list[Job]
    next_cursor: str | None
    """Pass as ``cursor`` for the next page; None when the walk reached the end."""
    capped: bool = False
    """True when the walk stopped at ``SCAN_CAP`` rows before filling the page: the page may
    be short, and ``next_cursor`` goes on from where the walk stopped."""


@dataclass(frozen=True, slots=True)
class BulkResult:
    acted: list[str] = field(default_factory=list)
    """Ids the action changed, in the order they were given."""
    skipped: list[str] = field(default_factory=list)
    """Ids left alone: gone, or in a state the action does not fit; in the order given."""

    @classmethod
    def of(cls, job_ids: Sequence[str], acted: Iterable[str]) -> BulkResult:
        """The result of an action given ``job_ids`` (repeats counted once) that changed
        ``acted``, whatever order the store's statements returned them in: every store
        answers alike."""
        done = set(acted)
        given = list(dict.fromkeys(job_ids))
        return cls([i for i in given if i in done], [i for i in given if i not in done])


@dataclass(frozen=True, slots=True)
class HourlyCount:
    hour: datetime
    """The start of the hour (store clock, UTC)."""
    event: str
    count: int


@dataclass(frozen=True, slots=True)
class Count:
    n: int
    exact: bool = True
    """False: the count stopped at ``COUNT_CAP`` (``n`` is then a lower bound) or is an
    estimate (``estimated``)."""
    estimated: bool = False

    def __str__(self) -> str:
        if self.exact:
            return f"{self.n:,}"
        return f"≈ {self.n:,}" if self.estimated else f"{self.n:,}+"


@dataclass(frozen=True, slots=True)
class QueueSummary:
    queue: str
    counts: dict[str, Count]
    """Each of ``SUMMARY_STATUSES``."""
    ready: Count
    oldest_ready_s: float
    """Seconds since the longest-waiting ready job became ready; 0.0 when none."""
    lapsed: Count = Count(0)
    """Processing jobs whose lease ran out and that no sweep reclaimed yet, counted by their
    own predicate in one read (``processing − in_flight``, read apart, counts a job finished
    between the two reads)."""


@dataclass(frozen=True, slots=True)
class TableHealth:
    """A table's live and dead rows, as the database's own statistics count them."""

    table: str
    live_rows: int
    dead_rows: int
    size_bytes: int
    last_vacuum: datetime | None = None

    @property
    def dead_share(self) -> float:
        total = self.live_rows + self.dead_rows
        return self.dead_rows / total if total else 0.0


@dataclass(frozen=True, slots=True)
class IndexHealth:
    """An index's size and the part of it estimated to be bloat: pages a fresh build would not
    need (emptied by deletes and updates, kept by the index)."""

    schema: str
    index: str
    table: str
    size_bytes: int
    estimated_bloat_bytes: int

    @property
    def bloat_share(self) -> float:
        return self.estimated_bloat_bytes / self.size_bytes if self.size_bytes else 0.0


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    worker_id: str
    queues: list[str]
    in_flight: int
    started_at: datetime
    last_beat_at: datetime


def actor_name(actor: str) -> str:
    """An operator's name as the journal keeps it: one line, bounded."""
    cleaned = " ".join(str(actor).split())[:MAX_ACTOR_CHARS]
    return cleaned or "unknown"


def actor_reason(actor: str) -> str:
    """The reason a bulk action journals: who did it."""
    return BY_ACTOR.format(actor=actor_name(actor))


def batches(ids: Sequence[str], size: int = BULK_BATCH) -> list[list[str]]:
    unique = list(dict.fromkeys(ids))
    return [unique[i:i + size] for i in range(0, len(unique), size)]


#: One row of an index walk: the sort value (JSON-able; None in id order), the id, and
#: whether the row passes the filters the index does not bound.
KeyRow = tuple[Any, str, bool]
#: ``read_key(key)``: a cursor's sort value as the store's ``fetch`` takes it (InvalidInput when
#: it is not a value that store gives).
ReadKey = Callable[[Any], Any]
#: ``fetch(after_key, after_id, n)``: up to ``n`` rows after the given position (``None,
#: None`` = from the start), in the page's order.
Fetch = Callable[[Any, "str | None", int], Sequence[KeyRow]]


def walk(fetch: Fetch, limit: int, cursor: str | None, cap: int = SCAN_CAP,
         time_cap_s: float = SCAN_TIME_S, clock: Callable[[], float] = time.monotonic,
         read_key: ReadKey = lambda key: key) -> tuple[list[str], str | None, bool]:
    """Walk an index from ``cursor`` in chunks, keeping the ids that match, until ``limit``
    of them are found, the index ends, ``cap`` rows were read or ``time_cap_s`` passed.
    Returns ``(ids, next_cursor, capped)``. The first chunk is the page's size, so an
    unfiltered page costs one query of ``limit`` rows. ``read_key`` checks the cursor's sort
    value: a cursor is the client's text, and reaches the store's query."""
    key, after_id = _decode(cursor)
    key = read_key(key)
    ids: list[str] = []
    walked = 0
    chunk = limit
    deadline = clock() + time_cap_s
    while True:
        size = min(chunk, cap - walked)
        rows = fetch(key, after_id, size)
        for row_key, row_id, hit in rows:
            walked += 1
            key, after_id = row_key, row_id
            if hit:
                ids.append(row_id)
                if len(ids) == limit:
                    return ids, _encode(key, after_id), False
        if len(rows) < size:
            return ids, None, False
        if walked >= cap or clock() >= deadline:
            return ids, _encode(key, after_id), True
        chunk = 2000


def _encode(key: Any, job_id: str | None) -> str:
    return json.dumps([key, job_id])


def _decode(cursor: str | None) -> tuple[Any, str | None]:
    if not cursor:
        return None, None
    try:
        key, job_id = json.loads(cursor)
    except (ValueError, TypeError, RecursionError):
        raise InvalidInput(BAD_CURSOR) from None
    if not isinstance(job_id, str) or not isinstance(key, (str, int, float, type(None))):
        raise InvalidInput(BAD_CURSOR)
    if not all(_encodable(text) for text in (job_id, key) if isinstance(text, str)):
        raise InvalidInput(BAD_CURSOR)  # a lone surrogate or a NUL, written as a JSON escape
    return key, job_id


def _encodable(text: str) -> bool:
    """Whether every store can take ``text``: UTF-8 (no lone surrogates), no NUL (which
    PostgreSQL's text refuses, and no job id holds)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def number_key(key: Any) -> float | None:
    """A cursor's sort value where the store sorts on a number (SQLite's ``updated_at``)."""
    if key is None:
        return None
    try:  # an integer past a float's range (10**400) is no time at all
        if not isinstance(key, bool) and isinstance(key, (int, float)) and math.isfinite(key):
            return key
    except OverflowError:
        pass
    raise InvalidInput(BAD_CURSOR)


def time_key(key: Any) -> str | None:
    """A cursor's sort value where the store sorts on a time (PostgreSQL's and MongoDB's
    ``updated_at``, as ISO 8601 text with its offset); given back in one canonical form."""
    if key is None:
        return None
    try:
        at = datetime.fromisoformat(key) if isinstance(key, str) else None
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise InvalidInput(BAD_CURSOR)
    return at.isoformat()


def prefix_end(prefix: str) -> str:
    """The least string above every string that starts with ``prefix`` (code-point order), so
    a prefix is one index range ``prefix <= id < prefix_end(prefix)``."""
    for i in range(len(prefix) - 1, -1, -1):
        if ord(prefix[i]) < 0x10FFFF:
            above = ord(prefix[i]) + 1
            if 0xD800 <= above <= 0xDFFF:  # surrogates have no UTF-8: the next one that does
                above = 0xE000
            return prefix[:i] + chr(above)
    return prefix + "\U0010ffff"  # only made of the highest code point: nearly unbounded
