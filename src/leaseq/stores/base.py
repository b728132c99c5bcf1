"""The store protocol: the primitives of DESIGN.md §3 that every store implements.

A store owns the records of many queues. Every primitive names its queue. Rules for all stores:

* Every written timestamp comes from the store's own clock (SQLite's ``julianday('now')``,
  PostgreSQL's ``now()``, MongoDB's ``$$NOW``), shifted by ``time_offset_s`` (tests only).
* ``lease_until`` is the lease while ``processing`` and the not-before while ``pending``.
  Pending jobs written by leaseq's SQL stores always carry one (enqueue time + delay); a pending
  job with none (an adopted MongoDB document) is ready at once.
* Every write after a claim is fenced: it matches ``queue + id + lease_epoch + status =
  'processing'``, and ``worker_id`` and ``claim_token`` when the ``Lease`` carries them (a job
  deleted and enqueued again repeats its epochs, and the same worker may claim its new life).
  When nothing matches, nothing is written and ``LeaseLost`` is raised.
* A *stale* job (its payload got a new revision while it was processing) is never finished by
  its worker: complete, complete_many, retry_later, fail, snooze and give_back turn into a
  give-back that starts the new revision fresh (``pending``, ready now, attempts, snoozes and
  givebacks 0; journal ``given_back`` with the stale reason), and the returned ``Job`` shows
  ``status == "pending"``.
* A new revision resets the job's budget (attempts, snoozes, givebacks 0; the spec's
  ``max_attempts``) whatever the status it finds, so no path leaves a ``pending`` job with
  attempts ≥ max_attempts (it would be unclaimable for ever). On a ``processing`` job the
  running attempt belongs to the old revision: should its lease expire, the job comes back
  ready for the new one (never ``failed(expired)`` for the old revision's attempts).
* Every transition to ``pending`` clears ``published_at`` (the outbox then owes a publish).
* Each state change writes its journal event in the same transaction, where the store has
  transactions. A journal entry never holds the payload.

Input has been validated by ``leaseq.queue.Queue`` before a store sees it.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Self

from leaseq.deprecated import warn_renamed
from leaseq.errors import StoreNotFound, StoreNotMigrated
from leaseq.job import (
    Completion,
    EnqueueOutcome,
    EnqueueResult,
    FollowUp,
    Job,
    JobSpec,
    JournalEntry,
    Lease,
    LeaseLost,
    OnConflict,
    is_terminal,
)
from leaseq.journal import REOWE_REASON
from leaseq.limits import NO_LIMITS, ClaimLimits, HeldBack
from leaseq.stores.protocol_ops import AsyncPrimitives, OperatorPrimitives, SchedulePrimitives
from leaseq.validate import redact_url

if TYPE_CHECKING:
    from leaseq.queue import Queue

#: Jobs a purge deletes (with their journal) per transaction: a first retention over a table
#: of millions holds no write lock for long (SQLite's is the whole database's), and no
#: statement runs into its call's deadline.
PURGE_BATCH = 1000

class Store(SchedulePrimitives, OperatorPrimitives, AsyncPrimitives, abc.ABC):
    """One database that holds leaseq's jobs. Thread-safe; open with ``leaseq.connect``.

    The schedule ledger, the operators' tools and the asyncio calls are declared in the
    mixins of ``leaseq.stores.protocol_ops``; this class holds the core primitives."""

    #: The URL with its password masked: safe to print.
    url: str
    #: Test-only: seconds added to the store's clock in every query ("advance time").
    time_offset_s: float = 0.0
    #: Whether ``enqueue_many(connection=…)`` and ``complete(then=…)`` are atomic.
    supports_transactions: bool = True
    #: Whether ``claim`` can enforce ``ClaimLimits`` (a store that cannot raises
    #: ``UnsupportedOperation`` when asked to).
    supports_claim_limits: bool = True
    #: Whether ``from_url`` takes ``create=False`` (open only an existing store, create
    #: nothing). ``connect`` passes it to no other store: that one opens as it always did.
    supports_create_false: bool = False
    #: The largest payload or result (its JSON text) the store can hold: a queue whose
    #: ``max_payload_bytes`` is larger is refused when it is made (``InvalidPolicy``).
    max_value_bytes: int = 1 << 30

    # --- set-up and upkeep ------------------------------------------------------------------

    @classmethod
    @abc.abstractmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Open the store a URL of this store's scheme names; what ``leaseq.connect`` calls
        for every scheme registered to this class (entry-point group ``leaseq.stores``).

        ``options`` are this store's keyword settings, next to those its URL may carry; an
        unknown one raises ``InvalidURL`` or ``InvalidInput``. The schema is created or
        upgraded before the store is returned. Errors never show the URL's password
        (``leaseq.validate.redact_url``). Raises ``StoreUnavailable`` when the database
        cannot be reached.

        A store whose ``supports_create_false`` is True also takes ``create=False``: then it
        creates, upgrades and indexes nothing, and raises (through ``require_schema``)
        ``StoreNotFound`` where there is no leaseq schema, ``StoreNotMigrated`` where the
        schema is older than this code. A newer schema opens, as it does with ``create``.
        """

    def queue(self, name: str, **policy: Any) -> Queue:
        """A handle on one queue with its policy (see ``QueuePolicy``)."""
        from leaseq.queue import Queue

        return Queue(self, name, **policy)

    @abc.abstractmethod
    def migrate(self) -> int:
        """Create or upgrade the schema (idempotent, safe to race). Returns the schema version."""

    def schema_version(self) -> int | None:
        """The schema version the database holds, read without writing anything: the one the
        last ``migrate`` returned (from any process, any leaseq version), so a newer database
        than this code shows as a higher number. ``None`` when the schema was never created.
        What ``leaseq doctor`` and the dashboard's health page read, never ``migrate``. Not
        abstract, so a store written before it keeps working: ``leaseq doctor`` reads it only
        for a store that ships migrations (this default raises ``NotImplementedError``)."""
        raise NotImplementedError(f"{type(self).__name__} does not report its schema version")

    @abc.abstractmethod
    def server_now(self) -> datetime:
        """The store's clock (plus ``time_offset_s``), timezone-aware UTC."""

    @abc.abstractmethod
    def queues(self) -> list[str]:
        """Names of the queues that hold at least one job, sorted. Empty list when none."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections. The store is unusable afterwards."""

    def drop(self) -> None:
        """Delete everything this store created (tables, schema, collections). For tests."""
        raise NotImplementedError

    # --- producers ------------------------------------------------------------------------

    @abc.abstractmethod
    def enqueue_many(
        self,
        queue: str,
        specs: Sequence[JobSpec],
        on_conflict: OnConflict = "raise",
        connection: Any = None,
    ) -> list[EnqueueResult]:
        """Insert or idempotently upsert jobs, all in one transaction; one result per spec.

        Per job, against the stored record with the same id (ids may repeat in one call; a
        later spec sees the effect of an earlier one):

        * none → insert ``pending``, not-before = now + ``delay_s`` → ``created``
        * spec.revision given and equal to the stored revision → ``unchanged``
        * spec.revision given and different → payload, task, revision and max_attempts
          replaced, attempts, snoozes and givebacks reset to 0, then by the stored status:
          terminal → ``pending``, failure/result cleared, not-before = now + delay →
          ``revived``; ``pending`` → not-before = now + delay → ``updated``; ``processing`` →
          marked stale (lease untouched) → ``updated``
        * no spec.revision and the same payload (``payload_json``) → ``unchanged``
        * no spec.revision and another payload → by ``on_conflict``: ``"raise"`` rolls the
          whole call back and raises ``JobConflict`` naming the ids; ``"keep"`` → ``conflict``
          and nothing changes; ``"replace"`` → as a new revision (revision set to None)

        Journal: ``enqueued`` with the outcome as reason, for created / updated / revived.
        ``connection``: the caller's open transaction (a DB-API connection of this store's
        kind) to write through; the caller commits. Stores that cannot raise
        ``UnsupportedOperation``.
        """

    # --- workers ---------------------------------------------------------------------------

    @abc.abstractmethod
    def claim(self, queue: str, worker_id: str, limit: int, lease_s: float,
              limits: ClaimLimits = NO_LIMITS) -> list[Job]:
        """Atomically take up to ``limit`` claimable jobs; ``[]`` when none.

        Claimable: ``attempts < max_attempts`` and (``pending`` with not-before ≤ now or
        none, or ``processing`` with ``lease_until`` < now). Taken in order of priority
        (highest first), then not-before, then id. ``limits`` (docs/limits.md), checked in
        the claim's own transaction under a lock per queue: with ``key_limit``, a job with a
        ``concurrency_key`` is taken only while fewer than ``key_limit`` jobs of its key are
        ``processing`` (the jobs this claim takes included; an expired lease holds its slot
        until ``reclaim_expired`` returns it, as a heartbeat could still extend it); with
        ``rate_per_s``, no more claims than that are stamped in any one-second window of the
        store's clock. A job a limit holds back stays ready and untouched.

        Each taken job: ``processing``, ``worker_id``, a new ``claim_token`` (the
        returned ``Job`` carries it into its ``lease``), lease_until = now +
        ``lease_s``, attempts + 1, lease_epoch + 1, stale cleared. Two concurrent claims never
        take the same job. Journal: ``claimed`` (reason ``redelivered`` on every claim after
        the first — after a retry, an expired lease, a snooze or a give-back — read from
        ``lease_epoch``, which nothing ever refunds).
        """

    @abc.abstractmethod
    def claim_one(self, queue: str, job_id: str, worker_id: str, lease_s: float,
                  limits: ClaimLimits = NO_LIMITS) -> Job | None:
        """Claim this one job if it is claimable now and ``limits`` (as for ``claim``) do not
        hold it back (broker delivery); else None, no write."""

    @abc.abstractmethod
    def heartbeat_many(self, queue: str, leases: Sequence[Lease], lease_s: float) -> list[str]:
        """Extend every lease still held to now + ``lease_s``, in one statement.

        Returns the ids of the leases no longer held (job gone, other epoch, not processing),
        in the order given; ``[]`` when all are held. A lost lease is never resurrected.
        Journal: ``heartbeat_lost`` for each lost one that still exists.
        """

    @abc.abstractmethod
    def complete(
        self,
        queue: str,
        lease: Lease,
        result_json: str | None,
        status: str = "done",
        result_key: str | None = None,
        then: Sequence[FollowUp] = (),
    ) -> Job:
        """Fenced finish: ``status`` (``done`` or an app terminal one), result saved, lease
        cleared. ``then``: follow-up jobs enqueued in the same transaction
        (``on_conflict="keep"``). Stale job → stale give-back instead (no follow-ups). Raises
        ``LeaseLost`` when fenced out (and then writes nothing, follow-ups included). Journal:
        ``result_saved``.
        """

    def complete_many(self, queue: str, items: Sequence[Completion]) -> list[Job | LeaseLost]:
        """Finish many jobs at once: each item is fenced on its own, exactly as ``complete``
        (stale → give-back). Returns, per item in order, the resulting ``Job`` or the
        ``LeaseLost`` it met (not raised). Stores override this with one transaction for the
        batch; this fallback loops."""
        out: list[Job | LeaseLost] = []
        for item in items:
            try:
                out.append(self.complete(queue, item.lease, item.result_json, item.status,
                                         item.result_key))
            except LeaseLost as exc:
                out.append(exc)
        return out

    @abc.abstractmethod
    def retry_later(
        self, queue: str, lease: Lease, error: str, reason: str, delay_s: float
    ) -> Job:
        """Fenced: back to ``pending`` with not-before = now + ``delay_s`` and ``error`` kept;
        when attempts are spent, ``failed(exhausted)`` instead. Stale job → stale give-back.
        ``LeaseLost`` when fenced out. Journal: ``retry_scheduled`` or ``quarantined``.
        """

    @abc.abstractmethod
    def snooze(self, queue: str, lease: Lease, delay_s: float, reason: str = "snoozed",
               max_snoozes: int = 200) -> Job:
        """Fenced: snoozes + 1; then, when the new count is above ``max_snoozes``,
        ``failed(exhausted)`` with the error "snoozed N times without finishing" (N the new
        count; journal ``quarantined``); otherwise back to ``pending`` with not-before = now +
        ``delay_s`` and attempts − 1, never below 0 (journal ``snoozed``). Stale job → stale
        give-back. ``LeaseLost`` when fenced out.
        """

    @abc.abstractmethod
    def give_back(self, queue: str, lease: Lease, started: bool, reason: str,
                  max_givebacks: int = 3) -> Job:
        """Fenced: back to ``pending``, ready now, ``published_at`` cleared; never a snooze.
        ``started=False`` (the handler never ran) → attempts − 1 (≥ 0), givebacks unchanged.
        ``started=True`` and givebacks < ``max_givebacks`` → attempts − 1 (≥ 0), givebacks
        + 1. ``started=True`` past the bound → the attempt is spent (attempts unchanged,
        givebacks unchanged), and when attempts ≥ max_attempts the job is
        ``failed(exhausted)`` instead, its error saying it was given back N times. Stale job
        → stale give-back. ``LeaseLost`` when fenced out. Journal: ``given_back`` with
        ``reason``, or ``quarantined``.
        """

    @abc.abstractmethod
    def fail(self, queue: str, lease: Lease, error: str, reason: str, failure: str) -> Job:
        """Fenced: quarantine as ``failed`` with ``failure`` and ``error``; lease cleared.
        Stale job → stale give-back. ``LeaseLost`` when fenced out. Journal: ``quarantined``.
        """

    # --- upkeep ----------------------------------------------------------------------------

    @abc.abstractmethod
    def reclaim_expired(self, queue: str) -> tuple[int, int]:
        """Three steps, the first two in this order (the other way round a spent job would
        be claimable for a moment): expired ``processing`` with attempts spent →
        ``failed(expired)``; then the other expired ``processing`` → ``pending``, ready now;
        then any ``pending`` job with attempts ≥ max_attempts (data written before leaseq
        reset a new revision's attempts: nothing would ever claim it) → ``failed(exhausted)``.
        Returns ``(failed, returned)``, failed counting both quarantines; ``(0, 0)`` when none.
        Journal: ``quarantined`` / ``reclaimed``.
        """

    @abc.abstractmethod
    def purge(self, queue: str, older_than_s: Mapping[str, float]) -> int:
        """Delete jobs (and their journal) whose status is a key of ``older_than_s`` and whose
        ``updated_at`` is older than its value in seconds, ``PURGE_BATCH`` jobs per
        transaction. Live statuses are refused by the caller. Returns how many jobs were
        deleted; 0 when none.
        """

    # --- operators -------------------------------------------------------------------------

    @abc.abstractmethod
    def requeue(self, queue: str, job_id: str) -> bool:
        """The operator's re-drive of a terminal job (failed, cancelled, done, app terminal):
        back to ``pending``, attempts, snoozes and givebacks 0, failure cleared, ready now.
        False when the job is live (pending / processing); ``JobNotFound`` when there is no
        such job. Journal: ``requeued`` (rows written before 0.2 say ``retried``).
        """

    @abc.abstractmethod
    def cancel(self, queue: str, job_id: str) -> bool:
        """Operator cancel of a ``pending``, ``processing`` or ``failed`` job (a processing
        job's worker is then fenced out). False for other terminal statuses; ``JobNotFound``
        when there is no such job. Journal: ``cancelled``.
        """

    # --- inspection ------------------------------------------------------------------------

    @abc.abstractmethod
    def get(self, queue: str, job_id: str) -> Job | None:
        """The job, or None."""

    @abc.abstractmethod
    def list_jobs(
        self, queue: str, status: str | None = None, limit: int = 100, after_id: str | None = None
    ) -> list[Job]:
        """Jobs ordered by id (after ``after_id``, for paging), optionally of one status."""

    @abc.abstractmethod
    def counts(self, queue: str) -> dict[str, int]:
        """Jobs by status; statuses with no job are left out; ``{}`` for an empty queue."""

    @abc.abstractmethod
    def ready_stats(self, queue: str) -> tuple[int, float]:
        """``(ready, oldest_pending_age_s)`` from one read: how many jobs are claimable now
        (the number an autoscaler should scale on), and the seconds since the longest-waiting
        of them became ready; ``(0, 0.0)`` when none."""

    @abc.abstractmethod
    def in_flight(self, queue: str) -> int:
        """How many ``processing`` jobs hold a live lease (``lease_until`` > now): work being
        done right now, which an autoscaler must not scale away; 0 when none."""

    def ready(self, queue: str) -> int:
        return self.ready_stats(queue)[0]

    def oldest_pending_age_s(self, queue: str) -> float:
        return self.ready_stats(queue)[1]

    @abc.abstractmethod
    def journal(self, queue: str, job_id: str) -> list[JournalEntry]:
        """The job's events, oldest first; ``[]`` when none."""

    @abc.abstractmethod
    def append_journal(
        self, queue: str, job_id: str, event: str, *, attempt: int | None = None,
        lease_epoch: int | None = None, worker_id: str | None = None,
        reason: str | None = None, data: Mapping[str, Any] | None = None,
    ) -> None:
        """Append one event to a job's journal on its own (events with no state change, such
        as a broker's ``received`` or ``ack_sent``)."""

    # --- broker outbox (DESIGN.md §5) ----------------------------------------------------

    @abc.abstractmethod
    def outbox_due(self, queue: str, limit: int) -> list[Job]:
        """Pending jobs that are due now and not yet published (``published_at`` empty), in
        not-before order; ``[]`` when none. Reads only."""

    @abc.abstractmethod
    def mark_published(self, queue: str, leases: Sequence[Lease],
                       as_of: datetime | None = None) -> list[str]:
        """Set ``published_at`` = now on those of ``leases`` (the jobs ``outbox_due`` gave,
        with their epochs) still ``pending``, unpublished, due and at that epoch. Call only
        after the broker confirmed. A claim in between bumps the epoch, so a late confirm
        never marks a later pending state that has no message behind it. ``as_of``: the
        newest ``updated_at`` of those jobs as ``outbox_due`` gave them; a job changed since
        without a claim (cancelled and requeued, its delay updated, edited) is in a state no
        message stands for either (its consumer may have acked the message as not claimable),
        and is not marked. Returns the ids marked (``[]`` when none). Journal: ``published``."""

    def prepare_outbox(self, stop: threading.Event | None = None) -> None:
        """Make sure what keeps ``outbox_due`` fast is in place, before a dispatcher's first
        ``outbox_due``: on return, ``outbox_due`` reads about as many index entries as it
        returns, however many published jobs wait for a consumer. Idempotent and safe to
        race (several dispatchers start together); a no-op when it is in place already.
        Raises ``StoreUnavailable`` when the store cannot be reached; another failure leaves
        ``outbox_due`` correct, only slower. ``stop`` set: returns at once, prepared or not
        (the dispatcher is stopping; the next start prepares it).

        The default does nothing: the store's schema holds that index from the start (SQLite's
        ``leaseq_jobs_outbox``, MongoDB's outbox index). PostgreSQL builds ``jobs_outbox`` here,
        so a schema without a broker never pays for it on enqueue and retry."""

    @abc.abstractmethod
    def republish(self, queue: str, published_before_s: float) -> int:
        """Clear ``published_at`` on ``pending`` jobs published more than
        ``published_before_s`` seconds ago: their message was lost (a purged or lost broker
        queue), and the outbox owes them a publish again. Returns how many; 0 when none. A
        second message for a job that still had one is harmless: only one claim wins."""

    # --- wake-ups --------------------------------------------------------------------------

    #: Whether ``wait_for_work`` hears enqueues made by other processes (PostgreSQL NOTIFY).
    supports_push_wakeups: bool = False

    def notify_local(self, queue: str) -> None:
        """Wake this process's workers now: a job was enqueued through this store object."""
        self._wakeup_event().set()

    def wait_for_work(self, queues: Sequence[str], timeout_s: float) -> bool:
        """Block up to ``timeout_s`` until a job may have become ready in one of ``queues``.

        True when woken (by an enqueue in this process, or a push wake-up from another),
        False on timeout. A wake-up is a hint: the caller still claims to find out.
        """
        event = self._wakeup_event()
        woken = event.wait(timeout_s)
        event.clear()
        return woken

    def _wakeup_event(self) -> threading.Event:
        event = self.__dict__.get("_leaseq_wakeup")
        if event is None:
            event = self.__dict__.setdefault("_leaseq_wakeup", threading.Event())
        return event

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- broker outbox: a message that was dead-lettered unsettled -------------------------

    #: The journal's reason for ``reowe_publish`` when the caller gives none.
    REOWE_REASON = REOWE_REASON

    @abc.abstractmethod
    def reowe_publish(self, queue: str, job_ids: Sequence[str],
                      reason: str = REOWE_REASON) -> list[str]:
        """Clear ``published_at`` on those of ``job_ids`` still ``pending`` with a publish
        marked: their message is gone without a verdict on the job (the broker dead-lettered
        it at its delivery limit), so the outbox owes them a publish again. Jobs in any other
        state, already owed, or unknown are left alone. Atomic per job. Returns the ids
        changed (``[]`` when none). Journal: ``publish_owed`` with ``reason``."""

    # --- limits in the claim (docs/limits.md) -------------------------------------------------

    @abc.abstractmethod
    def held_back(self, queue: str, limits: ClaimLimits | None = None) -> HeldBack:
        """How many ready jobs ``limits`` keep from being claimed: by key limits (per key, the
        ready jobs beyond its free slots; a lease that ran out holds none) and by the rate
        limit (of the rest, those beyond one second's claims). ``limits=None``: those the queue's
        limited claims last ran with, which the store keeps beside the rate log (so a reader
        without the app's policy, such as ``leaseq status``, sees the same). Reads only;
        ``HeldBack()`` when none."""

    def forget_limits(self, queue: str) -> None:
        """The queue's claims run without limits now: drop the limits its limited claims
        recorded, so that ``held_back`` and ``limited_queues`` (and the metrics and
        ``leaseq status`` built on them) stop counting ready jobs as held back by limits
        nobody claims under. ``Queue`` calls it once, at its first claim without limits.
        Writes nothing when none are recorded; a store without claim limits records none."""

    @abc.abstractmethod
    def limited_queues(self) -> dict[str, ClaimLimits]:
        """Each queue whose limited claims recorded limits, with those limits (what
        ``held_back(queue)`` counts by), in one read of the store's small limits table however
        many queues there are: a reader learns which queues ``held_back`` can say anything
        about without asking each. Reads only; ``{}`` when none."""

    # --- deprecated names (leaseq.deprecated), last so the class body's ``list`` stays the
    # built-in for the annotations above ------------------------------------------------------

    # --- deprecated names (leaseq.deprecated). Keep them last, and add new methods above:
    # after a method named ``list``, ``list[...]`` in this class body means that method ---------

    def list(self, queue: str, status: str | None = None, limit: int = 100,
             after_id: str | None = None) -> list[Job]:
        """Deprecated: ``list_jobs``."""
        warn_renamed("Store.list", "Store.list_jobs")
        return self.list_jobs(queue, status, limit, after_id)

    def retry(self, queue: str, job_id: str) -> bool:
        """Deprecated: ``requeue``."""
        warn_renamed("Store.retry", "Store.requeue")
        return self.requeue(queue, job_id)

    def claim_id(self, queue: str, job_id: str, worker_id: str, lease_s: float) -> Job | None:
        """Deprecated: ``claim_one``."""
        warn_renamed("Store.claim_id", "Store.claim_one")
        return self.claim_one(queue, job_id, worker_id, lease_s)

    def record(self, queue: str, job_id: str, event: str, **fields: Any) -> None:
        """Deprecated: ``append_journal``."""
        warn_renamed("Store.record", "Store.append_journal")
        self.append_journal(queue, job_id, event, **fields)


def require_schema(url: str, found: int | None, expected: int) -> None:
    """What a store opened with ``create=False`` checks before it is used: a leaseq schema at
    ``url`` (``found``: its version, None when there is none) no older than ``expected``,
    this code's latest. Raises ``StoreNotFound`` or ``StoreNotMigrated``, the URL's password
    masked."""
    if found is None:
        raise StoreNotFound(redact_url(url))
    if found < expected:
        raise StoreNotMigrated(redact_url(url), found, expected)


def decide_upsert(status: str, payload_json: str, revision: str | None, spec: JobSpec,
                  on_conflict: OnConflict) -> EnqueueOutcome:
    """What an enqueue does to an existing job (DESIGN.md §3); shared by the SQL stores."""
    if spec.revision is not None:
        if spec.revision == revision:
            return EnqueueOutcome.UNCHANGED
    elif payload_json == spec.payload_json:
        return EnqueueOutcome.UNCHANGED
    elif on_conflict != "replace":
        return EnqueueOutcome.CONFLICT
    return EnqueueOutcome.REVIVED if is_terminal(status) else EnqueueOutcome.UPDATED
