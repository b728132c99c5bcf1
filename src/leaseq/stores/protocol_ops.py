"""Groups of store primitives that ``leaseq.stores.base.Store`` inherits: the schedule
ledger, the operators' tools (dashboard and doctor) and the asyncio calls. Each is part of
the store protocol exactly as if declared in ``Store`` (see its module for the rules every
store follows)."""

from __future__ import annotations

import abc
import asyncio
import builtins
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from leaseq.browse import (
    COUNT_CAP,
    SNAPSHOT_MAX,
    BulkAction,
    BulkResult,
    HourlyCount,
    IndexHealth,
    JobFilter,
    JobPage,
    QueueSummary,
    TableHealth,
    WorkerInfo,
)
from leaseq.errors import InvalidInput
from leaseq.ledger import ScheduleState, TickAdvance
from leaseq.stores.watch import FinishWatch

if TYPE_CHECKING:
    from leaseq.job import EnqueueResult, Job, JobSpec, JournalEntry, OnConflict

T = TypeVar("T")


class SchedulePrimitives(abc.ABC):
    """The store primitives of periodic jobs."""

    # --- periodic jobs: the schedule ledger (docs/periodic.md) ------------------------------

    @abc.abstractmethod
    def register_schedule(self, name: str, queue: str, spec_json: str,
                          queues: Sequence[str] = ()) -> ScheduleState:
        """Write a schedule into the ledger as the code declares it, atomically per schedule.

        None of that name → inserted with cursor = now (it ticks only after its
        registration), version 0, active, not paused; journal ``schedule_registered``. One
        with another ``spec_json`` or queue, or inactive → spec and queue replaced, active
        again (cursor = max(cursor, now): the ticks while it was inactive never fire),
        version + 1; journal ``schedule_changed`` naming the changed fields (never their
        values). The same → no write. Returns the record as it is after.

        A record is another app's, and nothing is written, when it is active in a queue
        that is neither ``queue`` nor one of ``queues`` (the registrar's other queues):
        raises ``ScheduleConflict`` (see ``leaseq.ledger.owned``).
        """

    @abc.abstractmethod
    def schedule_state(self, name: str) -> ScheduleState | None:
        """The schedule's ledger record; None when there is none. A store without
        transactions first writes the jobs of an intent the record still holds (see
        ``advance_schedule``) and clears it, so the record returned has no intent."""

    @abc.abstractmethod
    def schedules(self) -> list[ScheduleState]:
        """Every ledger record, active or not, ordered by name; ``[]`` when none. Reads only."""

    @abc.abstractmethod
    def advance_schedule(self, name: str, version: int, advance: TickAdvance) -> bool:
        """Compare-and-set: when the record is at ``version``, active, not paused and its
        cursor before ``advance.cursor`` → cursor = ``advance.cursor``, version + 1, last tick
        and last job from ``advance.last``, skipped + ``len(advance.skipped)``, and
        ``advance.jobs`` enqueued in the schedule's queue (``on_conflict="keep"``: idempotent
        by id), with the journal of ``advance.journal()`` — all in one transaction. Returns
        True; False (nothing written) when the compare failed. Without transactions the CAS
        also stores the jobs as the record's *intent*, then writes them, then clears it; a
        crash in between leaves the intent for the next ``schedule_state`` to finish."""

    @abc.abstractmethod
    def trigger_schedule(self, name: str, queue: str, spec: JobSpec) -> bool:
        """A manual tick: when the schedule's record is in ``queue`` → ``spec`` enqueued there
        (``on_conflict="keep"``), the record's last job = ``spec.job_id`` (so ``overlap=
        "skip"`` waits for it), version + 1; journal ``tick_manual`` with the job id. The
        cursor does not move. Returns True; False (nothing written) when there is no such
        record. Atomic with transactions; without, the record is written first (a crash
        before the job leaves a last job that is not live, which overlaps nothing)."""

    @abc.abstractmethod
    def pause_schedule(self, name: str, paused: bool) -> bool:
        """Pause (``paused=True``) or resume a schedule; version + 1, so a scheduler's advance
        planned before it fails. A resume moves the cursor to now: ticks during the pause
        never fire. Returns False when it already was so or there is no such schedule.
        Journal: ``schedule_paused`` / ``schedule_resumed``."""

    @abc.abstractmethod
    def deactivate_schedules(self, queues: Sequence[str], keep: Sequence[str]) -> list[str]:
        """Mark inactive (version + 1; never deleted, never fired) the active schedules of
        ``queues`` whose name is not in ``keep``: schedules gone from the code. Returns their
        names, sorted; ``[]`` when none. Journal: ``schedule_inactive``."""



class OperatorPrimitives(abc.ABC):
    """The store primitives of the operators' tools."""

    # --- operators' tools: the dashboard and doctor (DESIGN.md §8) ---------------------------

    @abc.abstractmethod
    def find_jobs(self, where: JobFilter, limit: int = 50,
                  cursor: str | None = None) -> JobPage:
        """One page of the jobs that match ``where``, by keyset: ``cursor`` is the previous
        page's ``next_cursor``. Ordered as ``where.order`` says (newest ``updated_at`` first,
        then id, with a status; else by id). Every page walks an index from the cursor and
        reads at most ``SCAN_CAP`` rows: filters the index does not bound are checked on those
        rows, and a walk that stops at the cap returns a short page with ``capped`` set.
        An empty page with ``next_cursor`` None when nothing is left."""

    def snapshot_ids(self, where: JobFilter, limit: int = SNAPSHOT_MAX) -> list[str]:
        """The ids of every job matching ``where`` now, up to ``limit`` (a bulk action's
        snapshot: it acts on these ids, never on whatever matches later). Raises
        ``InvalidInput`` when more than ``limit`` match. ``[]`` when none."""
        ids: list[str] = []
        cursor: str | None = None
        while True:
            page = self.find_jobs(where, limit=1000, cursor=cursor)
            ids.extend(job.id for job in page.jobs)
            if len(ids) > limit:
                raise InvalidInput(f"more than {limit} jobs match; narrow the filter")
            if page.next_cursor is None:
                return ids
            cursor = page.next_cursor

    @abc.abstractmethod
    def act_on_jobs(self, queue: str, action: BulkAction, job_ids: Sequence[str],
                    actor: str) -> BulkResult:
        """Apply an operator's action to ``job_ids``, in batches of ``BULK_BATCH`` (one
        transaction each), each job only where the action fits its state now (see
        ``BulkAction``). Journal per job changed: ``ACTION_EVENTS[action]`` with reason
        ``"by <actor>"``. Ids gone or in another state are returned as skipped."""

    @abc.abstractmethod
    def requeue_edited(self, queue: str, job_id: str, payload_json: str, actor: str) -> bool:
        """Replace a terminal job's payload and put it back to ``pending`` at once, as an
        operator retry does (attempts, snoozes, givebacks 0, failure cleared). False when the
        job is live; ``JobNotFound`` when there is none. Journal: ``edited`` then ``requeued``,
        both with reason ``"by <actor>"`` (never the payload)."""

    @abc.abstractmethod
    def journal_hourly(self, queue: str, hours: int) -> list[HourlyCount]:
        """Journal events of ``queue`` counted per hour and event, for the hour now running
        and the ``hours − 1`` before it (store clock), oldest first; ``[]`` when none. The
        enqueues and claims are not counted (``leaseq.journal.HOURLY_UNCOUNTED``)."""

    @abc.abstractmethod
    def journal_counts(self, queue: str, within_s: float) -> dict[str, int]:
        """Journal events of ``queue`` in the last ``within_s`` seconds (store clock), counted
        per event; ``{}`` when none. As ``journal_hourly``, the enqueues and claims are not
        counted: "in the last hour" without the hours' edges."""

    @abc.abstractmethod
    def queue_summary(self, queue: str, cap: int = COUNT_CAP) -> QueueSummary:
        """Jobs of each of ``SUMMARY_STATUSES`` and the ready ones, each counted up to
        ``cap`` (past it: ``exact`` False, and an estimate where the store has one), with the
        oldest ready job's age; bounded work however large the queue. Zeros for an empty
        queue."""

    def table_health(self) -> list[TableHealth]:
        """Dead-row statistics of the store's tables, where the database keeps them
        (PostgreSQL: a table bloats when vacuum falls behind its updates). ``[]`` here: a
        store with nothing to say."""
        return []

    def index_health(self) -> list[IndexHealth]:
        """Each index of the store's tables with its size and estimated bloat, as of the
        database's last statistics (PostgreSQL: btree pages vacuum emptied but could not give
        back), by index name. ``[]`` here: a store with nothing to say."""
        return []

    @abc.abstractmethod
    def register_worker(self, worker_id: str, queues: Sequence[str], in_flight: int) -> None:
        """Record that a worker is alive now (upsert): its queues, how many jobs it holds,
        ``last_beat_at`` = now; ``started_at`` is set on the first call only."""

    @abc.abstractmethod
    def unregister_worker(self, worker_id: str) -> None:
        """Forget a worker that stopped cleanly; nothing when it is not registered."""

    @abc.abstractmethod
    def list_workers(self, limit: int = 1000) -> list[WorkerInfo]:
        """Registered workers by id, at most ``limit``, stale ones included (their
        ``last_beat_at`` tells); ``[]`` when none."""

    @abc.abstractmethod
    def prune_workers(self, older_than_s: float) -> int:
        """Forget workers whose last beat is more than ``older_than_s`` seconds old (killed
        ones never unregister). Returns how many; 0 when none."""



class AsyncPrimitives:
    """The store's calls for asyncio callers, and waiting for a job's finish."""

    if TYPE_CHECKING:  # the blocking primitives they run, declared in ``Store``
        enqueue_many: Callable[..., builtins.list[EnqueueResult]]
        get: Callable[[str, str], Job | None]
        counts: Callable[[str], dict[str, int]]
        journal: Callable[[str, str], builtins.list[JournalEntry]]
        requeue: Callable[[str, str], bool]
        cancel: Callable[[str, str], bool]

    # --- asyncio callers and waiting for a finish (leaseq.aio) -----------------------------

    async def aenqueue_many(self, queue: str, specs: Sequence[JobSpec],
                            on_conflict: OnConflict = "raise", connection: Any = None
                            ) -> builtins.list[EnqueueResult]:
        """``enqueue_many`` for asyncio callers. This default runs the blocking call in a
        worker thread (the SQLite store's way), so the event loop never waits on the
        database; stores with a native async driver override it and then take that driver's
        async connection as ``connection=``. Given the caller's own (blocking) connection, it
        runs on the caller's thread, in the caller's transaction: that connection belongs to
        its thread (sqlite3 refuses any other), and the caller already waits on it."""
        if connection is not None:
            return self.enqueue_many(queue, specs, on_conflict, connection)
        return await self._in_thread(self.enqueue_many, queue, specs, on_conflict, connection)

    async def aget(self, queue: str, job_id: str) -> Job | None:
        """``get`` for asyncio callers (default: in a worker thread)."""
        return await self._in_thread(self.get, queue, job_id)

    async def acounts(self, queue: str) -> dict[str, int]:
        """``counts`` for asyncio callers (default: in a worker thread)."""
        return await self._in_thread(self.counts, queue)

    async def ajournal(self, queue: str, job_id: str) -> builtins.list[JournalEntry]:
        """``journal`` for asyncio callers (default: in a worker thread)."""
        return await self._in_thread(self.journal, queue, job_id)

    async def arequeue(self, queue: str, job_id: str) -> bool:
        """``requeue`` (the operator's re-drive) for asyncio callers (default: in a thread)."""
        return await self._in_thread(self.requeue, queue, job_id)

    async def acancel(self, queue: str, job_id: str) -> bool:
        """``cancel`` for asyncio callers (default: in a worker thread)."""
        return await self._in_thread(self.cancel, queue, job_id)

    async def _in_thread(self, call: Callable[..., T], *args: Any) -> T:
        """Run a blocking store call on this store's one async worker thread. One thread, not
        a pool: the store serialises its calls anyway (SQLite: one connection), and every
        extra thread contends with the event loop for the GIL."""
        executor = self.__dict__.get("_leaseq_executor")
        if executor is None:
            executor = self.__dict__.setdefault("_leaseq_executor", ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="leaseq-async"))
        return await asyncio.get_running_loop().run_in_executor(executor, call, *args)

    async def aclose(self) -> None:
        """Release the connections the async methods opened on the running event loop (none
        by default). ``close`` still releases the rest."""
        return None

    def watch_finish(self, queue: str, job_id: str) -> FinishWatch:
        """A wake-up source for one job's finish, in place before the caller's first read of
        the job (so a finish between that read and the wait is never missed). Its waits are
        hints: the caller reads the job again after each. This default polls every
        ``FinishWatch.poll_s``; stores with change notifications override it."""
        return FinishWatch()

