"""``Queue``: one named queue over a store, with its policy. Validates, then calls the store."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from leaseq import validate
from leaseq.aio import AsyncQueueMethods
from leaseq.deprecated import warn_renamed
from leaseq.errors import InvalidInput, InvalidPolicy
from leaseq.job import (
    Completion,
    EnqueueResult,
    Failure,
    FollowUp,
    Job,
    JobSpec,
    JournalEntry,
    Lease,
    LeaseLost,
    OnConflict,
    is_terminal,
    message_of,
    message_text,
    newest_change,
    safe_reason,
)
from leaseq.limits import ClaimLimits, HeldBack
from leaseq.policy import QueuePolicy
from leaseq.redact import Redact, redact_tail
from leaseq.redact import redact as redact_builtin

if TYPE_CHECKING:
    from leaseq.stores.base import Store

_ON_CONFLICT = ("raise", "keep", "replace")


class Queue(AsyncQueueMethods):
    """The low-level API: ``while jobs := q.claim(worker_id): ...``. Thread-safe."""

    def __init__(self, store: Store, name: str, policy: QueuePolicy | None = None, *,
                 redact: Redact = redact_builtin, **options: Any):
        self.store = store
        self.redact = redact
        """Masks secrets in every error text and reason this queue writes (``leaseq.redact``)."""
        self.name = validate.queue_name(name)
        self.policy = QueuePolicy.build(policy, **options)
        if self.policy.max_payload_bytes > store.max_value_bytes:
            raise InvalidPolicy(
                f"max_payload_bytes={self.policy.max_payload_bytes} is more than "
                f"{type(store).__name__} can hold ({store.max_value_bytes} bytes)")
        self._rng = random.Random()
        self._limits_forgotten = False
        """Set once a claim without limits dropped the limits a limited claim recorded."""

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} on {self.store.url}>"

    # --- producers ------------------------------------------------------------------------

    def spec(
        self,
        job_id: str,
        payload: Mapping[str, Any],
        *,
        task: str | None = None,
        revision: str | None = None,
        delay_s: float = 0,
        max_attempts: int | None = None,
        priority: int = 0,
        concurrency_key: str | None = None,
    ) -> JobSpec:
        """A validated job description, for ``enqueue_many`` or ``complete(then=...)``."""
        if task is not None and not validate.text_field(task, 200):
            raise InvalidInput("task must be a non-empty string of at most 200 characters, "
                               "valid Unicode without NUL")
        if revision is not None and not validate.text_field(revision, 512, empty=True):
            raise InvalidInput("revision must be a string of at most 512 characters, valid "
                               "Unicode without NUL")
        attempts = self.policy.max_attempts if max_attempts is None else max_attempts
        if type(attempts) is not int or attempts != self.policy.max_attempts:
            QueuePolicy.build(self.policy, max_attempts=attempts)  # type and range check
        return JobSpec(  # by position (JobSpec's field order): a producer's hot path
            validate.job_id(job_id),
            dict(payload) if type(payload) is dict or isinstance(payload, Mapping) else payload,
            validate.payload(payload, self.policy.max_payload_bytes),
            task,
            revision,
            validate.delay_s(delay_s),
            attempts,
            validate.priority(priority),
            validate.concurrency_key(concurrency_key),
        )

    def enqueue(
        self,
        job_id: str,
        payload: Mapping[str, Any],
        *,
        task: str | None = None,
        revision: str | None = None,
        delay_s: float = 0,
        max_attempts: int | None = None,
        priority: int = 0,
        concurrency_key: str | None = None,
        on_conflict: OnConflict = "raise",
        connection: Any = None,
    ) -> EnqueueResult:
        """Insert or idempotently upsert one job (see ``Store.enqueue_many`` for outcomes).
        ``priority``: higher is claimed first (default 0). ``concurrency_key``: jobs sharing
        it run at most the queue's ``key_limit`` at once."""
        spec = self.spec(job_id, payload, task=task, revision=revision, delay_s=delay_s,
                         max_attempts=max_attempts, priority=priority,
                         concurrency_key=concurrency_key)
        return self._enqueue([spec], on_conflict, connection)[0]

    def enqueue_many(
        self,
        jobs: Iterable[JobSpec | Mapping[str, Any]],
        *,
        on_conflict: OnConflict = "raise",
        connection: Any = None,
    ) -> list[EnqueueResult]:
        """Enqueue many jobs in one transaction. Each item is a ``JobSpec`` or a dict with
        ``job_id``, ``payload`` and optionally ``task``, ``revision``, ``delay_s``,
        ``max_attempts``, ``priority``, ``concurrency_key``. All are validated before
        anything is written."""
        specs = [j if isinstance(j, JobSpec) else self._spec_from_dict(j) for j in jobs]
        return self._enqueue(specs, on_conflict, connection) if specs else []

    def _spec_from_dict(self, item: Mapping[str, Any]) -> JobSpec:
        if not isinstance(item, Mapping) or "job_id" not in item or "payload" not in item:
            raise InvalidInput("each job must be a JobSpec or a dict with job_id and payload")
        extra = set(item) - {"job_id", "payload", "task", "revision", "delay_s", "max_attempts",
                             "priority", "concurrency_key"}
        if extra:
            raise InvalidInput(f"unknown job field(s): {', '.join(sorted(extra))}")
        options = {k: v for k, v in item.items() if k not in ("job_id", "payload")}
        return self.spec(item["job_id"], item["payload"], **options)

    def _enqueue(
        self, specs: Sequence[JobSpec], on_conflict: OnConflict, connection: Any
    ) -> list[EnqueueResult]:
        if on_conflict not in _ON_CONFLICT:
            raise InvalidInput(f"on_conflict must be one of {', '.join(_ON_CONFLICT)}")
        results = self.store.enqueue_many(self.name, specs, on_conflict, connection)
        if connection is None:  # in a caller's transaction the job is visible only at commit
            self.store.notify_local(self.name)
        return results

    # --- workers ---------------------------------------------------------------------------

    def claim(self, worker_id: str, limit: int = 1, *, lease_s: float | None = None) -> list[Job]:
        """Atomically take up to ``limit`` ready jobs (``[]`` when none)."""
        limit = validate.batch_size(limit)
        worker_id = validate.worker_id(worker_id)
        limits = self.limits
        if limits.any:
            return self.store.claim(self.name, worker_id, limit, self._lease_s(lease_s),
                                    limits)
        self._forget_recorded_limits()
        return self.store.claim(self.name, worker_id, limit, self._lease_s(lease_s))

    def claim_one(self, job_id: str, worker_id: str, *,
                  lease_s: float | None = None) -> Job | None:
        """Claim this one job if it is ready now and no limit holds it back, else None (used
        by broker delivery)."""
        job_id, worker_id = validate.job_id(job_id), validate.worker_id(worker_id)
        limits = self.limits
        if limits.any:
            return self.store.claim_one(self.name, job_id, worker_id,
                                        self._lease_s(lease_s), limits)
        self._forget_recorded_limits()
        return self.store.claim_one(self.name, job_id, worker_id, self._lease_s(lease_s))

    def _forget_recorded_limits(self) -> None:
        """Before this handle's first claim without limits: the limits an earlier limited
        claim of the queue recorded (its policy had them then) no longer hold, so what reads
        them (``held_back``, the metrics, ``leaseq status``, the KEDA examples) must not count
        by them (``Store.forget_limits``)."""
        if not self._limits_forgotten:
            self.store.forget_limits(self.name)
            self._limits_forgotten = True

    @property
    def limits(self) -> ClaimLimits:
        """The limits every claim of this queue obeys (docs/limits.md)."""
        return ClaimLimits(self.policy.key_limit, self.policy.rate_per_s)

    def heartbeat(
        self, jobs: Iterable[Job | Lease], *, lease_s: float | None = None
    ) -> list[str]:
        """Extend the leases still held; returns the ids of those lost."""
        leases = [j.lease if isinstance(j, Job) else j for j in jobs]
        if not leases:
            return []
        return self.store.heartbeat_many(self.name, leases, self._lease_s(lease_s))

    def complete(
        self,
        job: Job | Lease,
        result: Any = None,
        *,
        status: str = "done",
        result_key: str | None = None,
        then: Iterable[JobSpec | tuple[str, JobSpec]] = (),
    ) -> Job:
        """Finish the job (fenced). ``then``: follow-up jobs written in the same transaction,
        as ``JobSpec`` (this queue) or ``(queue_name, JobSpec)``. Raises ``LeaseLost``."""
        result_json = validate.result(result, self.policy.max_payload_bytes)
        follow: dict[str, list[JobSpec]] = {}
        for item in then:
            name, spec = (self.name, item) if isinstance(item, JobSpec) else _follow_up(item)
            follow.setdefault(validate.queue_name(name), []).append(spec)
        done = self.store.complete(
            self.name, _lease(job), result_json, validate.terminal_status(status),
            validate.result_key(result_key),
            [FollowUp(name, specs) for name, specs in follow.items()],
        )
        for name in follow:  # follow-ups are ready now: wake this process's workers
            self.store.notify_local(name)
        return done

    def complete_many(
        self, items: Iterable[Job | tuple[Job | Lease, Any]], *, status: str = "done"
    ) -> list[Job | LeaseLost]:
        """Finish many jobs in one transaction: each item a job or ``(job, result)``. Each is
        fenced on its own; returns per item the resulting ``Job`` or its ``LeaseLost``."""
        status = validate.terminal_status(status)
        batch = []
        for item in items:
            job, result = item if isinstance(item, tuple) else (item, None)
            batch.append(Completion(_lease(job), validate.result(
                result, self.policy.max_payload_bytes), status))
        return self.store.complete_many(self.name, batch) if batch else []

    def retry_later(
        self, job: Job, error: BaseException | str, delay_s: float | None = None
    ) -> Job:
        """Back to pending after ``delay_s`` (None: the policy's backoff for this attempt);
        ``failed(exhausted)`` when attempts are spent. Raises ``LeaseLost``."""
        delay = (self.policy.backoff_s(job.attempts, self._rng) if delay_s is None
                 else validate.delay_s(delay_s))
        return self.store.retry_later(self.name, job.lease, _error_text(error, self.redact),
                                      safe_reason(error, redact=self.redact), delay)

    def snooze(self, job: Job | Lease, delay_s: float | None = None, reason: str = "snoozed",
               *, max_snoozes: int | None = None) -> Job:
        """Back to pending after ``delay_s`` (None: the policy's ``snooze_s``), the attempt
        given back; counted, and past ``max_snoozes`` (None: the policy's) the job is
        ``failed(exhausted)`` instead. Raises ``LeaseLost``."""
        delay = self.policy.snooze_s if delay_s is None else validate.delay_s(delay_s)
        bound = self.policy.max_snoozes if max_snoozes is None else _bound(
            max_snoozes, "max_snoozes")
        return self.store.snooze(self.name, _lease(job), delay,
                                 safe_reason(reason, redact=self.redact), bound)

    def give_back(self, job: Job | Lease, started: bool, reason: str = "given back", *,
                  max_givebacks: int | None = None) -> Job:
        """Back to pending, ready at once, without running it to an outcome (a worker
        stopping). Free when the handler never ``started``; when it did, free at most
        ``max_givebacks`` times (None: the policy's), then the attempt is spent. Not a
        snooze. Raises ``LeaseLost``."""
        if not isinstance(started, bool):
            raise InvalidInput(f"started must be True or False, got {started!r}")
        bound = self.policy.max_givebacks if max_givebacks is None else _bound(
            max_givebacks, "max_givebacks")
        return self.store.give_back(self.name, _lease(job), started,
                                    safe_reason(reason, redact=self.redact), bound)

    def fail(
        self, job: Job | Lease, error: BaseException | str, failure: str = Failure.PERMANENT
    ) -> Job:
        """Quarantine the job as ``failed(failure)``. Raises ``LeaseLost``."""
        if failure not in tuple(Failure):
            raise InvalidInput(f"failure must be one of {', '.join(Failure)}, got {failure!r}")
        return self.store.fail(self.name, _lease(job), _error_text(error, self.redact),
                               safe_reason(error, redact=self.redact), str(failure))

    # --- upkeep and operators -------------------------------------------------------------

    def reclaim_expired(self) -> tuple[int, int]:
        """``(failed, returned)``: spent expired jobs (and pending ones whose attempts are
        spent) quarantined, the other expired ones made ready."""
        return self.store.reclaim_expired(self.name)

    def purge(self, older_than_s: Mapping[str, float] | None = None, **by_status: float) -> int:
        """Delete terminal jobs per status older than the given seconds, e.g.
        ``q.purge(done=86400, tombstone=30 * 86400)``. Returns how many were deleted."""
        rules = {**(older_than_s or {}), **by_status}
        for status, age in rules.items():
            validate.terminal_status(status)
            validate.delay_s(age, f"retention for {status}")
        return self.store.purge(self.name, rules) if rules else 0

    def requeue(self, job_id: str) -> bool:
        """The operator's re-drive: a terminal job back to pending, attempts 0, ready now.
        False when the job is live; ``JobNotFound`` when there is none."""
        return self.store.requeue(self.name, validate.job_id(job_id))

    def cancel(self, job_id: str) -> bool:
        return self.store.cancel(self.name, validate.job_id(job_id))

    def outbox_due(self, limit: int = 100) -> list[Job]:
        return self.store.outbox_due(self.name, validate.batch_size(limit))

    def republish(self, published_before_s: float) -> int:
        """Owe a new publish for pending jobs published more than this many seconds ago."""
        return self.store.republish(self.name, validate.delay_s(published_before_s,
                                                                  "published_before_s"))

    def mark_published(self, jobs: Iterable[Job | Lease]) -> int:
        """After the broker confirmed: mark these jobs (as ``outbox_due`` gave them) published,
        those still in the state that was published (the same epoch, and, given jobs, not
        changed since they were read). Returns how many were marked."""
        items = list(jobs)
        if not items:
            return 0
        read = [j for j in items if isinstance(j, Job)]
        as_of = newest_change(read) if len(read) == len(items) else None
        return len(self.store.mark_published(self.name, [_lease(j) for j in items], as_of))

    # --- inspection ------------------------------------------------------------------------

    def get(self, job_id: str) -> Job | None:
        return self.store.get(self.name, validate.job_id(job_id))

    def list_jobs(self, status: str | None = None, limit: int = 100,
                  after_id: str | None = None) -> list[Job]:
        if status is not None and not validate.text_field(status, 64):
            raise InvalidInput(f"status must be a non-empty string or None, got "
                               f"{message_text(repr(status))[:80]}")
        if after_id is not None:
            after_id = validate.job_id(after_id)
        return self.store.list_jobs(self.name, status, validate.batch_size(limit), after_id)

    def iter_jobs(self, status: str | None = None, *, page_size: int = 500) -> Iterator[Job]:
        """Every job of the queue (or of one ``status``) in id order, read ``page_size`` at a
        time, so a queue of any size is walked in bounded memory. The walk resumes after the
        last id it saw: no job is yielded twice, and a job that changes meanwhile is seen in
        its old or its new state."""
        validate.batch_size(page_size, "page_size")
        after: str | None = None
        while page := self.list_jobs(status, page_size, after):
            yield from page
            if len(page) < page_size:
                return
            after = page[-1].id

    def counts(self) -> dict[str, int]:
        return self.store.counts(self.name)

    def ready(self) -> int:
        return self.store.ready(self.name)

    def oldest_pending_age_s(self) -> float:
        return self.store.oldest_pending_age_s(self.name)

    def in_flight(self) -> int:
        """Jobs being worked on now (processing under a live lease)."""
        return self.store.in_flight(self.name)

    def held_back(self) -> HeldBack:
        """Ready jobs this queue's limits keep from being claimed right now (by key limits,
        by the rate limit). A handle without limits reads those the queue's limited claims
        last ran with; zeros for a queue that never had any."""
        limits = self.limits
        return self.store.held_back(self.name, limits if limits.any else None)

    def journal(self, job_id: str) -> list[JournalEntry]:
        return self.store.journal(self.name, validate.job_id(job_id))

    def is_finished(self, job_id: str) -> bool:
        job = self.get(job_id)
        return job is not None and is_terminal(job.status)

    def _lease_s(self, lease_s: float | None) -> float:
        if lease_s is None:
            return self.policy.lease_s
        value = validate.delay_s(lease_s, "lease_s")
        if value <= 0:
            raise InvalidInput("lease_s must be > 0")
        return value

    # --- deprecated names (leaseq.deprecated). Keep them last, and add new methods above:
    # after a method named ``list``, ``list[...]`` in this class body means that method ---------

    def list(self, status: str | None = None, limit: int = 100,
             after_id: str | None = None) -> list[Job]:
        """Deprecated: ``list_jobs``."""
        warn_renamed("Queue.list", "Queue.list_jobs")
        return self.list_jobs(status, limit, after_id)

    def retry(self, job_id: str) -> bool:
        """Deprecated: ``requeue`` (easy to confuse with ``retry_later`` and ``leaseq.Retry``)."""
        warn_renamed("Queue.retry", "Queue.requeue")
        return self.requeue(job_id)

    def claim_id(self, job_id: str, worker_id: str, *,
                 lease_s: float | None = None) -> Job | None:
        """Deprecated: ``claim_one``."""
        warn_renamed("Queue.claim_id", "Queue.claim_one")
        return self.claim_one(job_id, worker_id, lease_s=lease_s)


def _bound(value: int, name: str) -> int:
    """A snooze or give-back bound, checked as the policy checks its own."""
    bound: int = getattr(QueuePolicy.build(None, **{name: value}), name)
    return bound


def _lease(job: Job | Lease) -> Lease:
    return job.lease if isinstance(job, Job) else job


def _follow_up(item: Any) -> tuple[str, JobSpec]:
    """A ``then`` item that is not a ``JobSpec``: ``(queue_name, JobSpec)``, else
    ``InvalidInput`` (raised before anything is written: the runner then fails the job for
    good, rather than leave it processing with its outcome unwritten)."""
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], JobSpec):
        return item[0], item[1]
    raise InvalidInput(f"each follow-up job must be a JobSpec (task.spec(...), queue.spec(...)) "
                       f"or a (queue_name, JobSpec) pair, got {type(item).__name__}")


def _error_text(error: BaseException | str, redact: Redact) -> str:
    """The record's ``error``: ``Type: message`` (a string as given), redacted, its end."""
    if isinstance(error, BaseException):
        text = f"{type(error).__name__}: {message_of(error)}"
    else:
        text = message_text(str(error))
    return redact_tail(text, validate.MAX_ERROR_CHARS, redact)
