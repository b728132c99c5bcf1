"""The journal's words, defined once: the event names and the fixed reasons every store writes.

Python code imports them from here. The SQL stores' ``queries/*.sql`` name them as
``{event.claimed}`` / ``{reason.redelivered}``, which ``sql_literals`` fills in when the
queries are loaded (the same text as a literal: the statements and their plans do not change),
and a reason that varies per call (``stale_reason``, ``reason``) is a bound parameter.

A text with a number or a word in it is a template here, its ``{name}`` fields filled by
``str.format`` in Python, by ``replace(%(template)s, '{name}', value)`` in SQL (the template
is a bound parameter) and by ``$concat`` on MongoDB (``documents.filled``).
"""

from __future__ import annotations

from enum import StrEnum


class JournalEvent(StrEnum):
    """What happened to a job; one journal row each."""

    ENQUEUED = "enqueued"  # reason: the enqueue outcome (created / updated / revived)
    CLAIMED = "claimed"  # reason REDELIVERED on every claim after the first
    HEARTBEAT_LOST = "heartbeat_lost"
    RESULT_SAVED = "result_saved"  # reason: the terminal status written
    RETRY_SCHEDULED = "retry_scheduled"
    SNOOZED = "snoozed"
    GIVEN_BACK = "given_back"
    QUARANTINED = "quarantined"  # reason: "<failure>: <why>" (``quarantine_reason``)
    RECLAIMED = "reclaimed"
    REQUEUED = "requeued"  # the operator's re-drive (``requeue``)
    CANCELLED = "cancelled"
    PUBLISHED = "published"
    RECEIVED = "received"  # broker delivery: the message arrived (``append_journal``)
    ACK_SENT = "ack_sent"
    PUBLISH_OWED = "publish_owed"
    EDITED = "edited"  # an operator replaced a terminal job's payload (then ``requeued``)
    DELETED = "deleted"  # an operator deleted a terminal job; the journal keeps this row
    OPERATOR_ACTION = "operator_action"  # who paused / resumed a schedule (dashboard)
    LEASE_ABANDONED = "lease_abandoned"  # the worker's lease clock ran out (``append_journal``)


class ScheduleEvent(StrEnum):
    """Journal events of a schedule (periodic jobs), written under its journal id
    (``leaseq.ledger.schedule_journal_id``)."""

    REGISTERED = "schedule_registered"
    CHANGED = "schedule_changed"
    INACTIVE = "schedule_inactive"
    PAUSED = "schedule_paused"
    RESUMED = "schedule_resumed"
    TICK_SKIPPED = "tick_skipped"
    TICKS_MISSED = "ticks_missed"
    TICK_MANUAL = "tick_manual"


#: Event names that older journal rows carry, by the event they mean today: rows are never
#: rewritten, so readers (the CLI's story, a query of the journal) accept both.
RENAMED_EVENTS = {"retried": JournalEvent.REQUEUED}

#: ``claimed`` after the first claim of a job (read from ``lease_epoch``, never refunded).
REDELIVERED = "redelivered"
#: ``requeued`` / ``cancelled``: an operator did it.
OPERATOR = "operator"
#: Why a stale job's finish was turned into a give-back (``given_back``).
STALE_REASON = "stale revision: the payload changed while this attempt ran"
#: ``reclaimed``: the lease ran out and the job is ready again.
LEASE_EXPIRED = "lease expired"
#: ``reclaimed`` of a stale job (MongoDB says so; its attempts were reset with the revision).
LEASE_EXPIRED_STALE = "lease expired; stale revision, attempts reset"
#: ``quarantined`` by reclaim: the lease ran out on the last attempt.
EXPIRED = "expired: lease ran out"
#: ``quarantined`` by reclaim's third step: a pending job whose attempts are spent.
SPENT_WHILE_PENDING = "exhausted: attempts spent while pending"
#: A schedule's ``schedule_registered`` / ``schedule_changed`` / ``schedule_inactive`` (its
#: declaration is no longer in the app's code).
SCHEDULE_REGISTERED = "registered"
SCHEDULE_CHANGED = "spec changed"
SCHEDULE_GONE = "gone from the code"
#: ``publish_owed`` when ``reowe_publish`` is given no reason.
REOWE_REASON = "its message was dead-lettered at the broker's delivery limit"

#: ``failed(exhausted)``'s error past ``max_snoozes``: n is the snooze that went past it.
SNOOZED_OUT = "snoozed {n} times without finishing"
#: ``failed(exhausted)``'s error when a give-back spends the last attempt: n give-backs so far.
GIVEN_BACK_OUT = "given back {n} times while its handler ran; its attempts are spent"
#: ``failed(expired)``'s error (reclaim's first step), then ``HELD_BY`` when the lease had a
#: worker.
LEASE_EXPIRED_ON = "lease expired on attempt {attempt} of {max_attempts}"
HELD_BY = " (worker {worker})"
#: ``failed(exhausted)``'s error from reclaim's third step (its reason: SPENT_WHILE_PENDING).
SPENT_WHILE_PENDING_ERROR = "attempts spent while pending ({attempt} of {max_attempts})"
#: ``heartbeat_lost``: the lease the worker held, and the job as it stands.
LEASE_LOST = "lease epoch {lease_epoch} lost; job is {status} at epoch {job_epoch}"
#: An operator's bulk action (``requeued``, ``cancelled``, ``deleted``): who did it.
BY_ACTOR = "by {actor}"

#: Events the hourly counts (``journal_hourly``) leave out: one per enqueue and one per claim,
#: the two a busy queue writes most, which no hourly figure reads (throughput is results
#: saved, failures are quarantines). So the index that serves the counts can leave them out
#: too, and an enqueue or a claim writes one index entry fewer. The SQL stores' index
#: (``journal_at``) and query name the same two events.
HOURLY_UNCOUNTED = (JournalEvent.ENQUEUED, JournalEvent.CLAIMED)

#: The fixed reasons the SQL text names, as ``{reason.<key>}``.
_SQL_REASONS = {"redelivered": REDELIVERED, "operator": OPERATOR, "lease_expired": LEASE_EXPIRED,
                "expired": EXPIRED, "spent_while_pending": SPENT_WHILE_PENDING}


def quarantine_reason(failure: str, why: str) -> str:
    """``quarantined``'s reason: the failure kind, then why. The SQL that writes the why
    itself appends it to ``quarantine_reason(failure, "")``."""
    return f"{failure}: {why}"


def sql_literals() -> dict[str, str]:
    """``{event.<name>}`` and ``{reason.<key>}`` → the SQL string literal, for
    ``leaseq.stores.sql.load_queries`` (none of these texts holds a quote: a unit test checks)."""
    words = {f"event.{e.value}": e.value for e in JournalEvent}
    words.update({f"reason.{key}": text for key, text in _SQL_REASONS.items()})
    return {key: f"'{text}'" for key, text in words.items()}
