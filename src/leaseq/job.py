"""The job record, its statuses and failure kinds, and the outcomes a handler can raise."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, NamedTuple

from leaseq import validate
from leaseq.deprecated import module_getattr

# LeaseLost lives with the other errors; it is imported from here too, where it always was.
from leaseq.errors import LeaseLost as LeaseLost
from leaseq.journal import GIVEN_BACK_OUT, SNOOZED_OUT
from leaseq.redact import Redact, redact, redact_tail


class JobStatus(StrEnum):
    """The built-in statuses. An app may also finish a job with its own terminal status."""

    PENDING = "pending"
    PROCESSING = "processing"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: Statuses a job can be claimed from; every other status is terminal.
LIVE_STATUSES = frozenset({JobStatus.PENDING, JobStatus.PROCESSING})


def is_terminal(status: str) -> bool:
    return status not in LIVE_STATUSES


class Failure(StrEnum):
    """Why a job is in quarantine (status ``failed``)."""

    PERMANENT = "permanent"  # the handler said so (leaseq.Permanent or a listed exception)
    EXHAUSTED = "exhausted"  # transient errors until max_attempts was spent
    EXPIRED = "expired"  # the lease ran out on the last attempt (crash, hang, OOM kill)
    INVALID = "invalid"  # payload does not fit the task, or the task is unknown


class EnqueueOutcome(StrEnum):
    """What enqueue did with one job."""

    CREATED = "created"
    UNCHANGED = "unchanged"
    UPDATED = "updated"
    REVIVED = "revived"
    CONFLICT = "conflict"


OnConflict = Literal["raise", "keep", "replace"]


class EnqueueResult(NamedTuple):
    """What enqueue did with one job. A named tuple, like ``JobSpec``: a batch makes one per
    job."""

    job_id: str
    outcome: EnqueueOutcome


class JobSpec(NamedTuple):
    """One job to enqueue, already validated (see ``leaseq.validate``).

    ``payload_json`` is the canonical JSON text of ``payload`` (sorted keys, no spaces): stores
    compare it to tell a replay from a conflict. Immutable; a named tuple rather than a frozen
    dataclass because producers build one per job: it is made four times faster (a frozen
    dataclass sets each of its nine fields through ``object.__setattr__``).
    """

    job_id: str
    payload: dict[str, Any]
    payload_json: str
    task: str | None = None
    revision: str | None = None
    delay_s: float = 0.0
    max_attempts: int = 5
    priority: int = 0
    """Higher is claimed first; equal priorities keep not-before, then id order."""
    concurrency_key: str | None = None
    """Jobs sharing a key run at most the queue's ``key_limit`` at once; None: unlimited."""


@dataclass(frozen=True, slots=True)
class Lease:
    """What fences every write after a claim: the job id, the epoch the claim set, the
    worker that claimed it and the claim's own token.

    The epoch alone does not tell a job's lives apart: a job deleted and enqueued again under
    the same id starts again at epoch 0, so its next claim repeats an epoch the old holder may
    still hold. The claim's ``worker_id`` (unique per worker process) tells another worker's
    claim apart, and ``claim_token`` (new at every claim) the same worker's claim of the new
    life, in another of its slots. ``None`` leaves that part unchecked (a lease made by hand,
    as in some tests, or a job claimed before the store recorded tokens)."""

    job_id: str
    lease_epoch: int
    worker_id: str | None = None
    claim_token: str | None = None

    def names(self, job: Job) -> bool:
        """Whether ``job`` (a record as a fenced write returned it) is this lease's claim: the
        check the stores' fenced writes make, for telling apart the results of a batch."""
        return (job.id == self.job_id and job.lease_epoch == self.lease_epoch
                and self.worker_id in (None, job.worker_id)
                and self.claim_token in (None, job.claim_token))

    def beaten(self, held: Mapping[tuple[str, int], str | None]) -> bool:
        """Whether a heartbeat that extended ``held`` (each job's id and epoch → its claim
        token) extended this lease: a batch may hold the leases of a job's two lives."""
        key = (self.job_id, self.lease_epoch)
        return key in held and self.claim_token in (None, held[key])


@dataclass(frozen=True, slots=True)
class Completion:
    """One item of ``Store.complete_many``: finish the job ``lease`` holds, as ``complete``
    would with the same arguments."""

    lease: Lease
    result_json: str | None = None
    status: str = "done"
    result_key: str | None = None


@dataclass(frozen=True, slots=True)
class FollowUp:
    """Jobs that ``Store.complete(then=…)`` enqueues into ``queue`` in the transaction that
    finishes the job (``on_conflict="keep"``)."""

    queue: str
    specs: Sequence[JobSpec]


@dataclass(slots=True)
class Job:
    """One job record (DESIGN.md §2). Timestamps are timezone-aware UTC, from the store's clock.

    ``lease_lost`` is not stored: the worker sets it when a heartbeat finds the lease gone or
    its local lease clock runs out, so a long handler can check it (or ``check()``) and stop.
    """

    id: str
    queue: str
    status: str
    payload: dict[str, Any]
    task: str | None = None
    attempts: int = 0
    max_attempts: int = 5
    snoozes: int = 0
    """``Snooze`` outcomes of this revision, bounded by the policy's ``max_snoozes``."""
    givebacks: int = 0
    """Give-backs of a running handler (a worker's stop) that refunded the attempt, bounded
    by the policy's ``max_givebacks``."""
    lease_until: datetime | None = None
    lease_epoch: int = 0
    worker_id: str | None = None
    error: str | None = None
    failure: str | None = None
    revision: str | None = None
    stale: bool = False
    result: Any = None
    result_key: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    first_seen_at: datetime | None = None
    published_at: datetime | None = None
    priority: int = 0
    concurrency_key: str | None = None
    claim_token: str | None = None
    """The token the last claim stamped on the record (part of ``lease``: it fences this
    claim's writes). Not part of ``to_dict``."""
    lease_lost: bool = field(default=False, compare=False)

    @property
    def lease(self) -> Lease:
        return Lease(self.id, self.lease_epoch, self.worker_id, self.claim_token)

    def check(self) -> None:
        """Raise ``LeaseLost`` once this worker no longer holds the job: a heartbeat found the
        lease gone, or the local lease clock ran out (no beat confirmed it in time; another
        worker may take the job soon). A long handler calls it between steps and stops."""
        if self.lease_lost:
            raise LeaseLost(self.queue, self.id, self.lease_epoch)

    @property
    def attempt(self) -> int:
        """The number of this attempt (1 for the first claim)."""
        return self.attempts

    def effect_key(self, name: str) -> str:
        """A key that is the same on every attempt of this job at this revision.

        Send it as the idempotency key of a remote call (a payment, an upload) so that a
        retried attempt cannot make the effect twice. A new revision of the job gets new keys.
        """
        raw = "\x1f".join((self.queue, self.id, self.revision or "", name))
        return "lq-" + hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:40]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view (timestamps as ISO 8601 strings)."""
        out: dict[str, Any] = {}
        for name in self.__slots__:
            if name in ("lease_lost", "claim_token"):
                continue
            value = getattr(self, name)
            out[name] = value.isoformat() if isinstance(value, datetime) else value
        return out


def newest_change(jobs: Sequence[Job]) -> datetime | None:
    """The newest ``updated_at`` of ``jobs`` as they were read, or None when one has none: a
    job changed after it is in another state (``Store.mark_published``'s ``as_of``)."""
    stamps = [j.updated_at for j in jobs if j.updated_at is not None]
    return max(stamps) if stamps and len(stamps) == len(jobs) else None


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One event in a job's history. ``reason`` is safe to show: never the payload."""

    at: datetime
    job_id: str
    event: str
    attempt: int | None = None
    lease_epoch: int | None = None
    worker_id: str | None = None
    reason: str | None = None
    data: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "job_id": self.job_id,
            "event": self.event,
            "attempt": self.attempt,
            "lease_epoch": self.lease_epoch,
            "worker_id": self.worker_id,
            "reason": self.reason,
            "data": dict(self.data) if self.data else None,
        }


# --- outcomes a handler raises -------------------------------------------------------------


class Retry(Exception):
    """Try again later. ``delay_s=None`` means the queue's backoff."""

    def __init__(self, reason: str = "retry requested", *, delay_s: float | None = None):
        super().__init__(reason)
        self.delay_s = _delay_or_none(delay_s)


class Permanent(Exception):
    """Stop now: the job goes to quarantine as ``failed(permanent)`` with this reason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Snooze(Exception):
    """Not the job's fault: put it back for ``delay_s`` and give the attempt back.

    ``delay_s=None`` means the policy's ``snooze_s`` (a few seconds): a condition that has not
    cleared is not looked at again at once. Every snooze is counted; past the policy's
    ``max_snoozes`` the job is quarantined as ``failed(exhausted)``.
    """

    def __init__(self, delay_s: float | None = None, reason: str = "snoozed"):
        super().__init__(reason)
        self.delay_s = _delay_or_none(delay_s)


def _delay_or_none(delay_s: float | None) -> float | None:
    """A ``Retry``'s or ``Snooze``'s delay, checked where the handler raises it: a bad one is
    an ``InvalidInput`` from the handler (a failed attempt, retried with the backoff), not a
    write the store refuses after the handler is gone."""
    return None if delay_s is None else validate.delay_s(delay_s)


def snoozed_too_often(snoozes: int) -> str:
    """The error of a job quarantined by the snooze bound."""
    return SNOOZED_OUT.format(n=snoozes)


def given_back_too_often(givebacks: int) -> str:
    """The error of a job whose attempts ran out while it kept being given back."""
    return GIVEN_BACK_OUT.format(n=givebacks)


def safe_reason(exc: BaseException | str, limit: int = 500, redact: Redact = redact) -> str:
    """The journal's reason for an error: its type and the last ``limit`` characters of it,
    redacted (``leaseq.redact``: an exception's text may carry a password or a token)."""
    text = redact_tail(message_text(exc) if isinstance(exc, str) else message_of(exc), limit,
                       redact)
    if isinstance(exc, str):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def message_of(exc: BaseException) -> str:
    """``str(exc)`` as a store can keep it (``message_text``); one whose ``__str__`` raised is
    ``<unprintable TypeName>``: the error of a job must never keep its outcome unwritten."""
    try:
        text = str(exc)
    except Exception:
        return f"<unprintable {type(exc).__name__}>"
    return message_text(text)


def message_text(text: str) -> str:
    """``text`` with any lone surrogate written as its escape (``\\udcff``): a file name from
    ``os.listdir`` in an error message would make every store's driver refuse the write."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


#: ``Outcome`` was renamed ``EnqueueOutcome`` (it clashed with the chaos harness's outcome).
__getattr__ = module_getattr(__name__, {"Outcome": "EnqueueOutcome"}, globals())
