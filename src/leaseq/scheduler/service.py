"""The scheduler: config, ``run_once`` and the loop (one maintenance service, as River writes
them). Every worker runs one by default; ``leaseq scheduler MODULE:APP`` runs one alone.

No leader: every scheduler reads a schedule's ledger record, plans the due ticks on the
database's clock, and advances the record by compare-and-set together with the ticks' jobs.
Two schedulers that plan the same tick write it once: the loser's CAS matches no row. Between
ticks a scheduler sleeps until the next one (plus a little jitter, so the later schedulers
mostly read an advanced cursor and write nothing), never longer than ``max_sleep_s``.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from leaseq.errors import InvalidInput, LeaseqError, ScheduleConflict
from leaseq.job import JobSpec, JournalEntry, safe_reason
from leaseq.ledger import FROM_QUEUE, ScheduleState, format_tick, schedule_journal_id
from leaseq.queue import Queue
from leaseq.redact import traceback_text
from leaseq.scheduler.plan import plan
from leaseq.scheduler.spec import Schedule
from leaseq.stores.base import Store

if TYPE_CHECKING:
    from leaseq.app import App

log = logging.getLogger(__name__)

#: Statuses in which a schedule's previous job still overlaps a new tick.
LIVE_STATUSES = ("pending", "processing")


class ScheduleNotFound(LeaseqError, LookupError):
    """No schedule of that name is in the ledger (``leaseq schedules`` lists them)."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    on_time_s: float = 60.0
    """With ``catch_up="skip"``, how late the latest due tick may be found and still fire
    (those before it never do). Defaults to 60 s."""
    max_sleep_s: float = 60.0
    """Longest sleep between looks at the ledger, so a pause, a resume or another deployment's
    change is seen. Defaults to 60 s."""
    retry_s: float = 5.0
    """Sleep after the store could not be reached. Defaults to 5 s."""
    jitter_s: float = 0.05
    """Up to this much random delay after each tick. Defaults to 50 ms."""
    retire_s: float = 300.0
    """How often the schedules of the app's queues that its code no longer declares are
    marked inactive again, and those it declares with another spec in the ledger written
    again (a scheduler of older code reactivates or respecs them during a rolling deploy;
    once it is gone, the newest code's word stands). Defaults to 5 minutes."""

    def __post_init__(self) -> None:
        for name in ("on_time_s", "max_sleep_s", "retry_s", "jitter_s", "retire_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise InvalidInput(f"{name} must be a number ≥ 0")
        if self.max_sleep_s <= 0:
            raise InvalidInput("max_sleep_s must be > 0")


class Scheduler:
    """Enqueues the ticks of an ``App``'s schedules. ``run_once`` looks once; ``run`` loops
    until ``stop`` is set."""

    def __init__(self, app: App, config: SchedulerConfig | None = None, *,
                 rng: Callable[[], float] = random.random):
        self.app = app
        self.config = config or SchedulerConfig()
        self._rng = rng
        self._registered = False
        self._retired_at: datetime | None = None  # None: at the next look (register did)

    @property
    def store(self) -> Store:
        return self.app.store

    def register(self) -> None:
        """Write the app's schedules into the ledger (a new one starts ticking from now; a
        changed one is journaled) and mark the ledger's other schedules of the app's queues
        inactive. A name another app's schedule holds is logged, and that schedule does not
        tick (each look tries again); the others do."""
        for schedule in self.app.schedules.values():
            try:
                self._register(schedule)
            except ScheduleConflict as exc:
                log.error("%s", self._why(exc), extra={"action": "schedule_conflict",
                                                       "schedule": schedule.name})
        self._retire()
        self._retired_at = None
        self._registered = True

    def _retire(self) -> None:
        """Mark inactive the schedules of the app's queues that its code does not declare
        (all of them when it declares none: its last schedule was removed)."""
        gone = self.store.deactivate_schedules(self._queues(), sorted(self.app.schedules))
        for name in gone:
            log.info("schedule %s is no longer in the code: marked inactive", name,
                     extra={"action": "schedule_inactive", "schedule": name})

    def _retire_now_and_then(self, now: datetime) -> None:
        """``_respec`` and ``_retire`` every ``retire_s`` on the database's clock, not only at
        the start: a scheduler of older code writes its spec, or reactivates a schedule it
        still declares, at its start and its looks; without this pass either would stand
        for good after it is gone."""
        last = self._retired_at
        if last is not None and (now - last).total_seconds() < self.config.retire_s:
            return
        if last is not None:  # None: register has just written and retired them
            self._respec()
            self._retire()
        self._retired_at = now

    def _respec(self) -> None:
        """Register again each declared schedule whose record in its queue holds another
        spec (a look re-registers only a record that is missing, inactive or elsewhere).
        Only here, once per ``retire_s``: while two versions of the code run, each writes
        its own spec at most that often (each write journaled ``schedule_changed``, the
        cursor kept), instead of at every look of each."""
        for schedule in self.app.schedules.values():
            state = self.store.schedule_state(schedule.name)
            if (state is None or state.queue != schedule.queue
                    or state.spec_json == schedule.spec_json()):
                continue  # missing or elsewhere: the look registers it (or logs the conflict)
            with contextlib.suppress(ScheduleConflict):  # taken meanwhile: the look logs it
                self._register(schedule)

    def _queues(self) -> list[str]:
        """The queues of the app: its schedules' and its tasks'. A schedule's record in one
        of them is this app's to move, to retire or to take."""
        return sorted({s.queue for s in self.app.schedules.values()} | set(
            self.app.queue_names()))

    def _register(self, schedule: Schedule) -> ScheduleState:
        """The schedule's record as this code declares it; ``ScheduleConflict`` when it is
        active in a queue the app does not use (another app's)."""
        return self.store.register_schedule(schedule.name, schedule.queue,
                                            schedule.spec_json(), self._queues())

    def run_once(self) -> float:
        """Enqueue every due tick once; returns the seconds until the next tick (at most
        ``max_sleep_s``). A schedule whose look fails is logged and looked at next time."""
        if not self._registered:
            self.register()
        now = self.store.server_now()
        self._retire_now_and_then(now)
        waits = [self.config.max_sleep_s]
        for schedule in self.app.schedules.values():
            try:
                waits.append(self._look(schedule, now))
            except LeaseqError as exc:
                log.warning("schedule %s: %s", schedule.name, self._why(exc),
                            extra={"action": "schedule_failed", "schedule": schedule.name})
            except Exception as exc:  # one schedule's bug must not stop the others' ticks
                log.error("schedule %s: unexpected error (%s)\n%s", schedule.name,
                          self._why(exc), traceback_text(exc, self.app.redact),
                          extra={"action": "schedule_failed", "schedule": schedule.name})
        return max(min(waits), 0.0)

    def run(self, stop: threading.Event) -> None:
        """Loop until ``stop`` is set; a store that is away is tried again after
        ``retry_s``. Errors are logged through the app's redactor: a store's on one line, an
        unexpected one with its traceback (``traceback_text``: each message redacted)."""
        while not stop.is_set():
            try:
                wait = self.run_once()
            except LeaseqError as exc:
                log.warning("scheduler: %s; trying again in %.0f s", self._why(exc),
                            self.config.retry_s)
                wait = self.config.retry_s
            except Exception as exc:  # a thread that died would stop the ticks without a word
                log.error("scheduler: unexpected error (%s); trying again in %.0f s\n%s",
                          self._why(exc), self.config.retry_s,
                          traceback_text(exc, self.app.redact))
                wait = self.config.retry_s
            stop.wait(min(wait + self._rng() * self.config.jitter_s, self.config.max_sleep_s))

    def _why(self, error: BaseException) -> str:
        """An error as a log line shows it: type and message, with the app's redactor."""
        return safe_reason(error, redact=self.app.redact)

    def _look(self, schedule: Schedule, now: datetime) -> float:
        state = self.store.schedule_state(schedule.name)
        if state is None or not state.active or state.queue != schedule.queue:
            # Deleted by hand (it starts again from now), marked inactive by a scheduler of
            # code that lacks it, or moved to another queue: this code declares it here. The
            # ticks go to the record's queue, so one of another app is never advanced.
            state = self._register(schedule)
        if state.paused:
            return self.config.max_sleep_s
        running = self._running(schedule, state)
        advance = plan(schedule, state, now, running, self.config.on_time_s,
                       lambda tick: self._spec(schedule, tick))
        cursor = state.cursor
        if advance is not None:
            if not self.store.advance_schedule(schedule.name, state.version, advance):
                return self._after_refused(schedule, state, advance.cursor)
            cursor = advance.cursor
            self._logged(schedule, advance.jobs)
        return (schedule.next_after(max(cursor, now)) - now).total_seconds()

    def _after_refused(self, schedule: Schedule, state: ScheduleState,
                       cursor: datetime) -> float:
        """The wait after the compare-and-set refused the advance to ``cursor``. Looking
        again at once is right only when the record moved (another scheduler, a pause, a
        change: each bumps the version): only then can the next look plan something else.
        A record that did not move refused the advance itself (a cursor it does not pass);
        the next look would plan the same advance, so looking at once would spin."""
        current = self.store.schedule_state(schedule.name)
        if current is None or current.version != state.version:
            return 0.0
        log.error("schedule %s: the ledger refused the advance from %s to %s; looking again "
                  "in %.0f s", schedule.name, format_tick(state.cursor), format_tick(cursor),
                  self.config.max_sleep_s,
                  extra={"action": "schedule_advance_refused", "schedule": schedule.name})
        return self.config.max_sleep_s

    def _running(self, schedule: Schedule, state: ScheduleState) -> str | None:
        if schedule.overlap == "allow" or state.last_job_id is None:
            return None
        job = self.store.get(schedule.queue, state.last_job_id)
        return job.id if job is not None and job.status in LIVE_STATUSES else None

    def _spec(self, schedule: Schedule, tick: datetime) -> JobSpec:
        return schedule.job_spec(self.app.queue(schedule.queue), schedule.job_id(tick), tick)

    @staticmethod
    def _logged(schedule: Schedule, jobs: Sequence[tuple[datetime, JobSpec]]) -> None:
        for tick, spec in jobs:
            log.info("schedule %s: tick %s enqueued as %s", schedule.name, format_tick(tick),
                     spec.job_id, extra={"action": "tick_enqueued", "schedule": schedule.name,
                                         "job_id": spec.job_id})


def trigger(store: Store, name: str) -> str:
    """Enqueue one job of the schedule ``name`` now, outside its ticks (the ledger's cursor
    does not move), journaled as a manual tick. Returns the job id."""
    state = store.schedule_state(name)
    if state is None:
        raise ScheduleNotFound(f"no schedule named {name[:100]!r} in the ledger")
    schedule = Schedule.from_ledger(state.name, state.queue, state.spec_json)
    now = store.server_now()
    spec = schedule.job_spec(Queue(store, state.queue), f"{name}@manual-{format_tick(now)}", now)
    # the ledger's last job too: with overlap="skip", the ticks wait for this one
    if not store.trigger_schedule(name, state.queue, spec):
        raise ScheduleNotFound(f"no schedule named {name[:100]!r} in queue "
                               f"{state.queue!r} in the ledger (changed meanwhile?)")
    return spec.job_id


def set_paused(store: Store, name: str, paused: bool) -> bool:
    """Pause or resume ``name``; False when it already was. A resumed schedule fires only the
    ticks after the resume."""
    if store.schedule_state(name) is None:
        raise ScheduleNotFound(f"no schedule named {name[:100]!r} in the ledger")
    return store.pause_schedule(name, paused)


def history(store: Store, name: str) -> list[JournalEntry]:
    """The schedule ``name``'s own journal, oldest first, from every queue it was written in:
    its record's queue, each queue a move took it from (the move's ``schedule_changed``
    names it, even when that queue has no job left), and the store's queues (moves journaled
    before they named their queue)."""
    state = store.schedule_state(name)
    if state is None:
        raise ScheduleNotFound(f"no schedule named {name[:100]!r} in the ledger")
    journal_id = schedule_journal_id(name)
    to_read = [state.queue, *store.queues()]
    read: set[str] = set()
    entries: list[JournalEntry] = []
    while to_read:
        queue = to_read.pop()
        if queue in read:
            continue
        read.add(queue)
        found = store.journal(queue, journal_id)
        entries += found
        to_read += [e.data[FROM_QUEUE] for e in found if e.data and e.data.get(FROM_QUEUE)]
    return sorted(entries, key=lambda e: e.at)  # stable: a queue's own order on a tie
