"""A schedule as the code declares it: when it ticks, and what each tick enqueues.

Cron expressions are parsed and evaluated by cronsim (Debian cron's rules, DST included): five
fields, or six with seconds as the first. ``every_s`` ticks are aligned to the Unix epoch, so
every scheduler computes the same instants whatever its start time. A tick is a UTC instant;
its job id is derived from the schedule's name and that instant, so one tick can only ever
be one job.
"""

from __future__ import annotations

import functools
import json
import re
import zoneinfo
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, get_args
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

from leaseq.errors import InvalidInput
from leaseq.ledger import format_tick

if TYPE_CHECKING:
    from leaseq.job import JobSpec
    from leaseq.queue import Queue

CatchUp = Literal["skip", "latest", "all"]
Overlap = Literal["allow", "skip"]
#: Schedule names: they appear in job ids, journal ids and the command line.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")
#: The payload key that carries the tick to a task that takes a ``tick`` argument.
TICK_PARAM = "tick"
#: The shortest ``every_s``: one job per second per schedule is already a lot of rows.
MIN_EVERY_S = 1.0
#: The longest ``every_s``, 100 years: every tick computed from now stays far inside
#: ``datetime``'s range (year 9999).
MAX_EVERY_S = 100 * 365.25 * 86_400
#: Spec fields compared when the code registers a schedule again (a change is journaled).
SPEC_FIELDS = ("task", "cron", "every_s", "timezone", "catch_up", "max_catch_up", "overlap",
               "payload", "max_attempts", "takes_tick", "priority")
#: Keys a tz database answers that name no place: the host's own zone (``localtime``), its
#: build's internals (``posixrules``, ``Factory``) and its variants of every zone (``posix/``,
#: ``right/``: with leap seconds, 27 s off). Each host may resolve them differently, so two
#: schedulers would compute different instants for one tick.
HOST_ZONES = frozenset({"localtime", "posixrules", "Factory"})
HOST_ZONE_DIRS = ("posix/", "right/")


@dataclass(frozen=True, slots=True)
class Due:
    """The ticks after a cursor up to now that a catch-up policy keeps, and those it drops."""

    ticks: list[datetime]
    dropped: int = 0
    first_dropped: datetime | None = None
    last_dropped: datetime | None = None


@dataclass(frozen=True, slots=True)
class Schedule:
    """One periodic schedule (``@app.periodic`` / ``app.schedule`` build it; see
    docs/periodic.md). Exactly one of ``cron`` and ``every_s``."""

    name: str
    task: str
    queue: str
    cron: str | None = None
    """Cron expression, 5 fields or 6 with seconds first. Defaults to None."""
    every_s: float | None = None
    """Seconds between ticks (1 to 100 years), aligned to the Unix epoch. Defaults to None."""
    timezone: str = "UTC"
    """IANA zone the cron expression is read in. Defaults to UTC."""
    catch_up: CatchUp = "latest"
    """Missed ticks: ``skip`` none, ``latest`` the latest one, ``all`` up to
    ``max_catch_up``. Defaults to ``latest``."""
    max_catch_up: int = 100
    """With ``catch_up="all"``, at most this many missed ticks (the latest). Defaults to 100."""
    payload: Mapping[str, Any] = field(default_factory=dict)
    """The job's payload (the task's keyword arguments). Defaults to none."""
    overlap: Overlap = "allow"
    """``skip``: a tick whose previous job is still pending or processing is skipped.
    Defaults to ``allow``."""
    max_attempts: int = 5
    """The tick job's attempts (the task's policy). Defaults to 5."""
    takes_tick: bool = False
    """Whether the task takes a ``tick`` argument (the tick, an aware datetime)."""
    priority: int = 0
    """The tick job's priority (the task's). Defaults to 0."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.fullmatch(self.name):
            raise InvalidInput(f"schedule name {str(self.name)[:80]!r} is not allowed: use 1-100 "
                               "letters, digits, '_', '.', ':' or '-', starting with a letter "
                               "or digit")
        if (self.cron is None) == (self.every_s is None):
            raise InvalidInput(f"schedule {self.name!r}: give exactly one of cron= and every_s=")
        self._check_timing()
        if self.catch_up not in get_args(CatchUp):
            raise InvalidInput(f"schedule {self.name!r}: catch_up must be skip, latest or all")
        if self.overlap not in get_args(Overlap):
            raise InvalidInput(f"schedule {self.name!r}: overlap must be allow or skip")
        if (not isinstance(self.max_catch_up, int) or isinstance(self.max_catch_up, bool)
                or not 1 <= self.max_catch_up <= 100_000):
            raise InvalidInput(f"schedule {self.name!r}: max_catch_up must be 1..100000")
        if not isinstance(self.payload, Mapping):
            raise InvalidInput(f"schedule {self.name!r}: payload must be a mapping")
        if self.takes_tick and TICK_PARAM in self.payload:
            raise InvalidInput(f"schedule {self.name!r}: the payload may not set 'tick', the "
                               "scheduler passes it")
        object.__setattr__(self, "payload", dict(self.payload))

    def _check_timing(self) -> None:
        self._check_zone()
        if self.cron is not None:
            self._check_cron(self.cron)
            return
        every = self.every_s
        if (isinstance(every, bool) or not isinstance(every, int | float)
                or not MIN_EVERY_S <= every <= MAX_EVERY_S):
            raise InvalidInput(f"schedule {self.name!r}: every_s must be a number from "
                               f"{MIN_EVERY_S:g} to {MAX_EVERY_S:g} (100 years)")

    def _check_zone(self) -> None:
        """Only a key of the tz database that names a place: ``ZoneInfo`` alone would take a
        host's own (``localtime``) or a file's path under the database (``posix/...``)."""
        key = self.timezone
        if isinstance(key, str) and (key in HOST_ZONES or key.startswith(HOST_ZONE_DIRS)):
            raise InvalidInput(f"schedule {self.name!r}: time zone {key!r} depends on the "
                               "host, so schedulers on two hosts would tick at different "
                               "instants: name the IANA zone (such as Europe/Kyiv or UTC)")
        if not isinstance(key, str) or key not in known_zones():
            raise InvalidInput(f"schedule {self.name!r}: unknown time zone {str(key)[:60]!r} "
                               "(use an IANA name such as Europe/Kyiv; a host without a tz "
                               "database needs `pip install tzdata`)")

    def _check_cron(self, cron: object) -> None:
        if not isinstance(cron, str):
            raise InvalidInput(f"schedule {self.name!r}: cron must be a string such as "
                               f"'0 3 * * *', not {type(cron).__name__}")
        try:
            CronSim(cron, datetime(2000, 1, 1, tzinfo=self.zone))
        except (CronSimError, TypeError) as exc:
            raise InvalidInput(f"schedule {self.name!r}: bad cron expression "
                               f"{cron[:80]!r}: {exc}") from None

    # --- when it ticks ----------------------------------------------------------------------

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def ticks_after(self, cursor: datetime) -> Iterator[datetime]:
        """The ticks strictly after ``cursor``, in order, as UTC instants (endless)."""
        if self.every_s is not None:
            return _every_ticks_after(round(self.every_s * 1000), cursor)
        return _strictly_increasing(self._cron_ticks(cursor), after=cursor)

    def _cron_ticks(self, start: datetime) -> Iterator[datetime]:
        """cronsim's ticks from ``start`` as UTC instants, not yet filtered (see
        ``_strictly_increasing``). A tick of a second offset may follow ``start`` while its
        minute is before it: the minutes are read from that much earlier."""
        assert self.cron is not None
        minutes, seconds = _minutes_and_seconds(self.cron)
        earlier = start - timedelta(seconds=seconds[-1])
        for local in CronSim(minutes, earlier.astimezone(self.zone)):
            for second in seconds:
                yield local.astimezone(UTC) + timedelta(seconds=second)

    def next_after(self, moment: datetime) -> datetime:
        return next(self.ticks_after(moment))

    def due(self, cursor: datetime, now: datetime, keep: int) -> Due:
        """Ticks in (cursor, now]: the latest ``keep`` of them, and how many before those."""
        if self.every_s is not None:
            return self._due_every(self.every_s, cursor, now, keep)
        kept: deque[datetime] = deque()
        dropped: list[datetime] = []  # only the first and the last are kept
        count = 0  # the dropped ones, counted on the one walk (cron ticks cost a step each)
        for tick in self.ticks_after(cursor):
            if tick > now:
                break
            kept.append(tick)
            if len(kept) > keep:
                dropped[1:] = [kept.popleft()]
                count += 1
        if not dropped:
            return Due(list(kept))
        return Due(list(kept), count, dropped[0], dropped[-1])

    @staticmethod
    def _due_every(every_s: float, cursor: datetime, now: datetime, keep: int) -> Due:
        """Arithmetic, not iteration: a long outage of an every-second schedule is cheap."""
        step_ms = round(every_s * 1000)
        first_n, last_n = _epoch_ms(cursor) // step_ms + 1, _epoch_ms(now) // step_ms
        count = max(last_n - first_n + 1, 0)
        kept_from = max(first_n, last_n - keep + 1)
        ticks = [_at_ms(n * step_ms) for n in range(kept_from, last_n + 1)]
        dropped = count - len(ticks)
        if not dropped:
            return Due(ticks)
        return Due(ticks, dropped, _at_ms(first_n * step_ms), _at_ms((kept_from - 1) * step_ms))

    # --- what a tick enqueues ---------------------------------------------------------------

    def job_id(self, tick: datetime) -> str:
        """The tick's job id: the schedule's name and the UTC instant."""
        return f"{self.name}@{format_tick(tick)}"

    def job_spec(self, queue: Queue, job_id: str, tick: datetime) -> JobSpec:
        """The job of a tick (or of a manual one, at ``tick``) for the schedule's ``queue``,
        with the task's attempts and priority, as the task's own enqueue gives them."""
        return queue.spec(
            job_id, self.tick_payload(tick), task=self.task, max_attempts=self.max_attempts,
            priority=self.priority)

    def tick_payload(self, tick: datetime) -> dict[str, Any]:
        payload = dict(self.payload)
        if self.takes_tick:
            payload[TICK_PARAM] = tick.astimezone(self.zone).isoformat()
        return payload

    # --- as the ledger keeps it -------------------------------------------------------------

    def spec_json(self) -> str:
        """Canonical JSON of the spec: equal text means the same schedule."""
        return json.dumps({k: getattr(self, k) for k in SPEC_FIELDS}, sort_keys=True,
                          separators=(",", ":"))

    @classmethod
    def from_ledger(cls, name: str, queue: str, spec_json: str) -> Schedule:
        """The schedule a ledger record describes (for the command line: no app needed).
        Raises ``InvalidInput`` for a spec this code cannot read (another version's, or
        damaged): what shows a ledger shows the rest of it."""
        try:
            fields = json.loads(spec_json)
            return cls(name=name, queue=queue,
                       **{k: fields[k] for k in SPEC_FIELDS if k in fields})
        except InvalidInput:
            raise
        except (ValueError, TypeError, KeyError) as exc:  # not JSON, not an object, no task
            raise InvalidInput(f"schedule {name[:100]!r}: its spec in the ledger cannot be "
                               f"read ({type(exc).__name__})") from None

    def describe(self) -> str:
        if self.cron is not None:
            return f"cron {self.cron}"
        return f"every {self.every_s:g} s"


@functools.cache
def known_zones() -> frozenset[str]:
    """The zone keys a schedule may name: the tz database's (the system's, else the
    ``tzdata`` package's) less ``HOST_ZONES`` and ``HOST_ZONE_DIRS``. Scanned once per
    process (the scan reads the database's directory, tens of milliseconds)."""
    return frozenset(key for key in zoneinfo.available_timezones()
                     if key not in HOST_ZONES and not key.startswith(HOST_ZONE_DIRS))


def _minutes_and_seconds(cron: str) -> tuple[str, tuple[int, ...]]:
    """A cron expression as a 5-field one and the seconds of each of its minutes.

    cronsim applies Debian cron's DST rule (docs/periodic.md) only to 5-field expressions at
    fixed times (minute and hour not starting with ``*``); read as it is, a 6-field one at a
    fixed time would skip a day at spring forward and fire twice at fall back. So such an
    expression is read as its 5 last fields, each tick offset by each second of its first.
    Any other expression is read as it is (``(0,)``: no offset)."""
    fields = cron.split()
    if len(fields) != 6 or fields[1].startswith("*") or fields[2].startswith("*"):
        return cron, (0,)
    seconds = CronSim(cron, datetime(2000, 1, 1, tzinfo=UTC)).seconds
    return " ".join(fields[1:]), tuple(sorted(seconds))


def _every_ticks_after(step_ms: int, cursor: datetime) -> Iterator[datetime]:
    n = _epoch_ms(cursor) // step_ms + 1
    while True:
        yield _at_ms(n * step_ms)
        n += 1


def _strictly_increasing(ticks: Iterable[datetime], after: datetime) -> Iterator[datetime]:
    """``ticks`` less any at or before ``after`` or at or before the tick yielded last.

    For a fixed time (Debian cron's rule) cronsim walks naive local wall time, so its start
    loses the fold: started inside the second pass of a repeated hour (01:10 EST on a
    fall-back night), ``30 1 * * *`` gives that day's 01:30 of the first pass (01:30 EDT),
    an instant *before* the start. Such a tick was decided before the cursor got there;
    planned again, it would fire a tick from before a registration or resume, journal a
    false miss, and give an advance that does not move the cursor, which the compare-and-set
    refuses on every look. cronsim's wall time only goes forward, so at most the repeated
    hour's ticks are skipped."""
    last = after
    for tick in ticks:
        if tick > last:
            yield tick
            last = tick


def _epoch_ms(moment: datetime) -> int:
    delta = moment.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return delta // timedelta(milliseconds=1)


def _at_ms(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
