"""Stored documents → leaseq's ``Job`` and ``JournalEntry``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from leaseq.job import Job, JournalEntry, Lease
from leaseq.journal import LEASE_EXPIRED, LEASE_EXPIRED_STALE, LEASE_LOST, REDELIVERED
from leaseq.stores.mongodb.documents import DEFAULT_MAX_ATTEMPTS, PROCESSING, payload_of


@dataclass(frozen=True, slots=True)
class Event:
    """One journal entry to write: whose, what happened, and its fields (``attempt``,
    ``lease_epoch``, ``worker_id``, ``reason``, ``data``)."""

    queue: str
    job_id: str
    event: str
    fields: dict[str, Any]


class JournalWriter(Protocol):
    """``MongoStore._log`` as the mixins see it: append these entries (in ``session``)."""

    def __call__(self, events: Sequence[Event], session: Any = None) -> None: ...


def dt(value: Any) -> datetime | None:
    """BSON dates are UTC; a client built without ``tz_aware`` returns them naive."""
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def ready_age_s(stats: Mapping[str, Any]) -> float:
    """The oldest ready job's age in seconds from ``documents.ready``'s row (0 when none is
    ready, or its not-before is ahead of the server clock)."""
    age_ms = stats.get("age_ms")
    return max(float(age_ms) / 1000.0, 0.0) if age_ms is not None else 0.0


def job(queue: str, doc: Mapping[str, Any]) -> Job:
    """A job from its document; fields an adopted document lacks take their defaults."""
    result = doc.get("result")
    return Job(
        id=doc["_id"], queue=queue, status=doc.get("status", "pending"),
        payload=payload_of(doc), task=doc.get("task"),
        attempts=int(doc.get("attempts") or 0),
        max_attempts=int(doc.get("max_attempts") or DEFAULT_MAX_ATTEMPTS),
        lease_until=dt(doc.get("lease_until")), lease_epoch=int(doc.get("lease_epoch") or 0),
        worker_id=doc.get("worker_id"), error=doc.get("error"), failure=doc.get("failure"),
        revision=doc.get("revision"), stale=bool(doc.get("stale")),
        snoozes=int(doc.get("snoozes") or 0), givebacks=int(doc.get("givebacks") or 0),
        result=json.loads(result) if isinstance(result, str) else result,
        result_key=doc.get("result_key"), created_at=dt(doc.get("created_at")),
        updated_at=dt(doc.get("updated_at")), first_seen_at=dt(doc.get("first_seen_at")),
        published_at=dt(doc.get("published_at")), priority=int(doc.get("priority") or 0),
        concurrency_key=doc.get("concurrency_key"), claim_token=doc.get("claim_token"),
    )


def entry(doc: Mapping[str, Any]) -> JournalEntry:
    return JournalEntry(
        # every entry is written with its ``at``
        at=dt(doc.get("at")), job_id=doc["job_id"], event=doc["event"],  # type: ignore[arg-type]
        attempt=doc.get("attempt"), lease_epoch=doc.get("lease_epoch"),
        worker_id=doc.get("worker_id"), reason=doc.get("reason"), data=doc.get("data"),
    )


def claimed_fields(found: Job) -> dict[str, Any]:
    """``redelivered`` on every claim after the first: the epoch counts claims and is never
    refunded (attempts are, by a snooze or a give-back)."""
    return {"attempt": found.attempts, "lease_epoch": found.lease_epoch,
            "worker_id": found.worker_id,
            "reason": REDELIVERED if found.lease_epoch > 1 else None}


def reclaim_reason(doc: Mapping[str, Any]) -> str:
    return LEASE_EXPIRED_STALE if doc.get("stale") else LEASE_EXPIRED


def holds(doc: Mapping[str, Any] | None, lease: Lease) -> bool:
    return (doc is not None and doc.get("status") == PROCESSING
            and doc.get("lease_epoch") == lease.lease_epoch
            and lease.worker_id in (None, doc.get("worker_id"))
            and lease.claim_token in (None, doc.get("claim_token")))


def lost_fields(doc: Mapping[str, Any], lease: Lease) -> dict[str, Any]:
    return {"attempt": doc.get("attempts", 0), "lease_epoch": lease.lease_epoch,
            "reason": LEASE_LOST.format(lease_epoch=lease.lease_epoch, status=doc.get("status"),
                                        job_epoch=doc.get("lease_epoch", 0))}


def fields(doc: Mapping[str, Any], lease: Lease, reason: str | None) -> dict[str, Any]:
    return {"attempt": doc.get("attempts", 0), "lease_epoch": lease.lease_epoch,
            "worker_id": doc.get("worker_id"), "reason": reason}


def moved(doc: Mapping[str, Any], reason: str | None) -> dict[str, Any]:
    return {"attempt": doc.get("attempts", 0), "lease_epoch": doc.get("lease_epoch", 0),
            "worker_id": doc.get("worker_id"), "reason": reason}
