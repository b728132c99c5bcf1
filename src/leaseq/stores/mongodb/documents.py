"""Every filter, pipeline update, sort, projection and index spec the MongoDB store sends.

Pure functions, no I/O: the unit tests assert these documents, and ``store.py`` only sends them.

Rules kept everywhere:

* Every written timestamp is ``$$NOW`` (the server's clock) shifted by ``offset_s`` through
  ``$dateAdd`` in milliseconds; filters compare against the same expression inside ``$expr``, so
  neither reads nor writes depend on the worker's clock.
* Updates are aggregation pipelines (a list of stages). A pipeline evaluates every string that
  starts with ``$`` as a field path, so every value that comes from the caller is wrapped in
  ``$literal``.
* Documents of the original shape are adopted as they are: a missing ``attempts`` /
  ``lease_epoch`` reads as 0, a missing ``max_attempts`` as ``DEFAULT_MAX_ATTEMPTS`` (the claim
  has no queue policy to take it from), a pending job with no ``lease_until`` is ready now.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from string import Formatter
from typing import Any

from leaseq.job import Lease
from leaseq.journal import (
    GIVEN_BACK_OUT,
    HELD_BY,
    LEASE_EXPIRED_ON,
    SNOOZED_OUT,
    SPENT_WHILE_PENDING_ERROR,
)
from leaseq.stores.mongodb.indexes import job_indexes, journal_indexes
from leaseq.validate import RESERVED_KEYS

__all__ = ["job_indexes", "journal_indexes"]  # kept importable from here

#: What a document without ``max_attempts`` gets (DESIGN.md §2's default).
DEFAULT_MAX_ATTEMPTS = 5
PENDING, PROCESSING, FAILED = "pending", "processing", "failed"
#: The record's own fields; every other top-level field is payload. The counters and the
#: move token (``stamped``) are listed here too, so a record field is never read as payload
#: whatever the validator reserves.
RECORD_KEYS = RESERVED_KEYS | {"snoozes", "givebacks", "priority", "concurrency_key",
                               "next_concurrency_key", "moved_by"}
#: Fields of the record kept when a new payload replaces the old one (the rest is payload).
RECORD_FIELDS = sorted(RECORD_KEYS)
#: The stored document's own record fields, without its payload (an expression).
RECORD_OF_ROOT = {"$arrayToObject": {"$filter": {"input": {"$objectToArray": "$$ROOT"},
                                                 "cond": {"$in": ["$$this.k", RECORD_FIELDS]}}}}
#: Claim order: highest priority first (a document without one sorts after every number),
#: then not-before, then id.
CLAIM_SORT = [("priority", -1), ("lease_until", 1), ("_id", 1)]
#: The outbox publishes in not-before order (a broker delivers in its own order anyway).
OUTBOX_SORT = [("lease_until", 1), ("_id", 1)]
ID_SORT = [("_id", 1)]
JOURNAL_SORT = [("at", 1), ("_id", 1)]

Doc = dict[str, Any]


# --- expressions ---------------------------------------------------------------------------


def lit(value: Any) -> Doc:
    """A caller's value, never read as a field path or an operator."""
    return {"$literal": value}


def filled(template: str, **values: Any) -> list[Any]:
    """``$concat``'s parts for a ``leaseq.journal`` template: its text as it is (none of it
    starts with ``$``), each ``{name}`` field the string of the expression ``values[name]``."""
    parts: list[Any] = []
    for text, name, _, _ in Formatter().parse(template):
        if text:
            parts.append(text)
        if name is not None:
            parts.append({"$toString": values[name]})
    return parts


def now(offset_s: float, plus_s: float = 0.0) -> Doc:
    """The server clock plus the test offset and ``plus_s``, to the millisecond."""
    return {"$dateAdd": {"startDate": "$$NOW", "unit": "millisecond",
                         "amount": round((offset_s + plus_s) * 1000)}}


def attempts() -> Doc:
    return {"$ifNull": ["$attempts", 0]}


def max_attempts() -> Doc:
    return {"$ifNull": ["$max_attempts", DEFAULT_MAX_ATTEMPTS]}


def snoozes() -> Doc:
    return {"$ifNull": ["$snoozes", 0]}


def givebacks() -> Doc:
    return {"$ifNull": ["$givebacks", 0]}


def refunded() -> Doc:
    """``attempts − 1``, never below 0: the attempt was not the job's fault."""
    return {"$max": [{"$subtract": [attempts(), 1]}, 0]}


def is_stale() -> Doc:
    return {"$eq": [{"$ifNull": ["$stale", False]}, True]}


def key_after_revision() -> Doc:
    """The key a job runs with once its current attempt ends: a stale job's new revision's
    (``next_concurrency_key``; a stale document from before that field keeps its key)."""
    waiting = {"$ne": [{"$type": "$next_concurrency_key"}, "missing"]}
    return {"$cond": [{"$and": [is_stale(), waiting]}, "$next_concurrency_key",
                      "$concurrency_key"]}


def spent() -> Doc:
    return {"$gte": [attempts(), max_attempts()]}


def first_seen(offset_s: float) -> Doc:
    # $ifNull instead of $setOnInsert: an upsert that also $sets the field would conflict.
    return {"$ifNull": ["$first_seen_at", now(offset_s)]}


# --- filters -------------------------------------------------------------------------------


def has_attempts_left() -> Doc:
    return {"$lt": [attempts(), max_attempts()]}


def claimable(offset_s: float) -> Doc:
    """DESIGN.md §3: attempts left and (fresh, due, or an expired lease). A stale job with an
    expired lease is claimable whatever its attempts: its new revision never ran, and the
    claim starts it afresh (see ``claim``).

    A rooted ``$or`` whose every branch carries all of its conditions: MongoDB plans each
    branch as its own scan of ``CLAIM_INDEX`` and merges them in claim order (``SORT_MERGE``),
    so a claim reads from the front of the index and stops at its limit.
    """
    clock, left = now(offset_s), has_attempts_left()
    return {"$or": [
        {"status": PENDING, "lease_until": None, "$expr": left},
        {"status": PENDING, "lease_until": {"$type": "date"},
         "$expr": {"$and": [{"$lte": ["$lease_until", clock]}, left]}},
        {"status": PROCESSING, "lease_until": {"$type": "date"},
         "$expr": {"$and": [{"$lt": ["$lease_until", clock]}, {"$or": [left, is_stale()]}]}},
    ]}


def claimable_id(job_id: str, offset_s: float) -> Doc:
    return {"_id": job_id, **claimable(offset_s)}


#: ``KEYED_INDEX``'s partial filter, which a query must carry word for word to use it.
HAS_KEY = {"concurrency_key": {"$type": "string"}}


def claimable_keyed(key: str, offset_s: float) -> Doc:
    """Claimable jobs of one concurrency key: each branch served by ``KEYED_INDEX``."""
    return {"$or": [{**branch, "concurrency_key": key}
                    for branch in claimable(offset_s)["$or"]], "$and": [HAS_KEY]}


def live_keyed() -> Doc:
    """Live jobs with a concurrency key: the key walk of a key-limited claim."""
    return {"status": {"$in": [PENDING, PROCESSING]}, **HAS_KEY}


def pending_keys() -> list[Doc]:
    """The keys of pending jobs, each once (the key walk of a key-limited claim). A ``$group``
    on the key alone after an equality on ``status``: ``KEYED_INDEX`` holds the keys in order
    right after ``status``, so the server can answer it with one seek per key (a distinct
    scan) rather than a read of every pending job's index entry: a backlog's size is not its
    cost."""
    return [{"$match": {"status": PENDING, **HAS_KEY}}, {"$group": {"_id": "$concurrency_key"}}]


def keys_running(keys: list[str]) -> list[Doc]:
    """Per key of ``keys``: how many of its jobs are processing (a key-limited claim's front,
    ``limited._front_ids``). Served by ``KEYED_INDEX`` (its ``status`` and key prefix)."""
    return [
        {"$match": {"status": PROCESSING, "concurrency_key": {"$in": keys}, "$and": [HAS_KEY]}},
        {"$group": {"_id": "$concurrency_key", "running": {"$sum": 1}}},
    ]


def key_counts(offset_s: float, processing_only: bool = False,
               lapsed_free: bool = False) -> list[Doc]:
    """Per key with live jobs: how many are processing and how many are claimable. It reads
    every live keyed job's index entry (``held_back``); ``processing_only``: every processing
    keyed job's, as many as run at once whatever the backlog (the key walk of a key-limited
    claim: the keys of its jobs whose lease ran out, and every key's running count).
    ``lapsed_free`` (``held_back``): a job whose lease ran out is not counted as running, only
    as claimable (the next sweep frees its slot)."""
    ready = {"$or": [branch_expr(b, offset_s) for b in claimable(offset_s)["$or"]]}
    running: Doc = {"$eq": ["$status", PROCESSING]}
    if lapsed_free:
        running = {"$and": [running, {"$gte": ["$lease_until", now(offset_s)]}]}
    return [
        {"$match": {"status": PROCESSING, **HAS_KEY} if processing_only else live_keyed()},
        {"$group": {"_id": "$concurrency_key",
                    "running": {"$sum": {"$cond": [running, 1, 0]}},
                    "ready": {"$sum": {"$cond": [ready, 1, 0]}}}},
    ]


def branch_expr(branch: Doc, offset_s: float) -> Doc:
    """A ``claimable`` branch as an aggregation expression (for ``$cond``)."""
    terms: list[Any] = []
    for field, condition in branch.items():
        if field == "$expr":
            terms.append(condition)
        elif condition is None:
            terms.append({"$eq": [{"$ifNull": ["$" + field, None]}, None]})
        elif isinstance(condition, dict) and "$type" in condition:
            terms.append({"$eq": [{"$type": "$" + field}, condition["$type"]]})
        else:
            terms.append({"$eq": ["$" + field, condition]})
    return {"$and": terms}


def limits_claim(key_limit: int | None, rate_per_s: int | None, offset_s: float) -> list[Doc]:
    """The write that opens a limited claim on the queue's limits document: it makes every
    other limited claim of the queue conflict with this transaction, reads the clock, and
    records the limits the claim runs with (for ``held_back`` without them)."""
    return [{"$set": {"claims": {"$add": [{"$ifNull": ["$claims", 0]}, 1]},
                      "recent": {"$ifNull": ["$recent", []]},
                      "key_limit": lit(key_limit), "rate_per_s": lit(rate_per_s),
                      "now": now(offset_s)}}]


def fenced(lease: Lease, stale: bool | None = None) -> Doc:
    """The guard of every write after a claim. ``stale`` splits a finish from its snooze."""
    guard: Doc = {**holder(lease), "status": PROCESSING}
    if stale is True:
        guard["stale"] = True
    elif stale is False:
        guard["stale"] = {"$ne": True}
    return guard


def holder(lease: Lease) -> Doc:
    """The document ``lease`` names: its id, its epoch and, when the lease has them, the
    claim's worker and token (a job deleted and enqueued again repeats its epochs, and the
    same worker may claim its new life; see ``Lease``)."""
    doc: Doc = {"_id": lease.job_id, "lease_epoch": lease.lease_epoch}
    if lease.worker_id is not None:
        doc["worker_id"] = lease.worker_id
    if lease.claim_token is not None:
        doc["claim_token"] = lease.claim_token
    return doc


def held(leases: Sequence[Lease]) -> Doc:
    """Heartbeat: the leases of this list still held (``$in`` narrows, ``$or`` fences)."""
    return {
        "_id": {"$in": [lease.job_id for lease in leases]},
        "status": PROCESSING,
        "$or": [holder(lease) for lease in leases],
    }


def expired(offset_s: float, spent_: bool) -> Doc:
    """Reclaim: processing with a lapsed lease, attempts spent (step 1) or not (step 2).

    A stale job (a new revision arrived while it ran) belongs to step 2 whatever its
    attempts: its new revision never ran, so it goes back to pending with attempts reset.
    """
    lapsed = {"$lt": ["$lease_until", now(offset_s)]}
    if spent_:
        which: Doc = {"$and": [spent(), {"$not": [is_stale()]}]}
    else:
        which = {"$or": [is_stale(), {"$not": [spent()]}]}
    return {"status": PROCESSING, "lease_until": {"$type": "date"},
            "$expr": {"$and": [lapsed, which]}}


def pending_spent() -> Doc:
    """Reclaim step 3: pending with attempts spent, which no claim would ever take (older
    data; no leaseq path writes it any more). ``attempts ≥ 1`` lets ``SPENT_INDEX`` skip the
    never-claimed backlog: a spent job has ``attempts ≥ max_attempts ≥ 1``."""
    return {"status": PENDING, "attempts": {"$gte": 1}, "$expr": spent()}


def in_flight(offset_s: float) -> Doc:
    """Processing with a live lease: work a worker is doing now."""
    return {"status": PROCESSING, "lease_until": {"$type": "date"},
            "$expr": {"$gt": ["$lease_until", now(offset_s)]}}


def lapsed(offset_s: float) -> Doc:
    """Processing under a lease that ran out: a job no sweep reclaimed yet."""
    return {"status": PROCESSING, "lease_until": {"$type": "date"},
            "$expr": {"$lt": ["$lease_until", now(offset_s)]}}


def outbox_due(offset_s: float) -> Doc:
    """Pending, unpublished, due, attempts left; a rooted ``$or`` served by ``OUTBOX_INDEX``
    branch by branch, in claim order."""
    left = has_attempts_left()
    return {"$or": [
        {"status": PENDING, "published_at": None, "lease_until": None, "$expr": left},
        {"status": PENDING, "published_at": None, "lease_until": {"$type": "date"},
         "$expr": {"$and": [{"$lte": ["$lease_until", now(offset_s)]}, left]}},
    ]}


def published_before(published_before_s: float, offset_s: float) -> Doc:
    """Pending jobs whose publish is older than ``published_before_s`` (a lost message)."""
    return {"status": PENDING, "published_at": {"$type": "date"},
            "$expr": {"$lt": ["$published_at", now(offset_s, -published_before_s)]}}


def unpublish() -> list[Doc]:
    return [{"$set": {"published_at": None}}]


def unpublished(leases: Sequence[tuple[str, int]], offset_s: float,
                as_of: datetime | None = None) -> Doc:
    """Only the state that was published: still pending, unpublished and due, at the epoch
    outbox_due read (a claim and give-back in between bumped it; that later pending state is
    owed its own publish) and, given ``as_of``, not changed after it (``Store.mark_published``).
    A document without ``lease_epoch`` is at epoch 0."""
    at_epoch: list[Doc] = []
    for job_id, epoch in leases:
        at_epoch.append({"_id": job_id, "lease_epoch": epoch})
        if epoch == 0:
            at_epoch.append({"_id": job_id, "lease_epoch": {"$exists": False}})
    due = outbox_due(offset_s)
    query: Doc = {"_id": {"$in": [job_id for job_id, _ in leases]}, "status": PENDING,
                  "published_at": None, "$and": [{"$or": at_epoch}, {"$or": due["$or"]}]}
    if as_of is not None:
        query["updated_at"] = {"$lte": as_of}
    return query


def operator_requeueable(job_id: str) -> Doc:
    return {"_id": job_id, "status": {"$nin": [PENDING, PROCESSING]}}


def cancellable(job_id: str) -> Doc:
    return {"_id": job_id, "status": {"$in": [PENDING, PROCESSING, "failed"]}}


def purgeable(status: str, older_than_s: float, offset_s: float) -> Doc:
    """A document without an ``updated_at`` date has no age and is never purged by it."""
    return {"status": status, "updated_at": {"$type": "date"},
            "$expr": {"$lt": ["$updated_at", now(offset_s, -older_than_s)]}}


def listing(status: str | None, after_id: str | None) -> Doc:
    query: Doc = {}
    if after_id is not None:
        query["_id"] = {"$gt": after_id}
    if status is not None:
        query["status"] = status
    return query


def journal_of(queue: str, job_id: str) -> Doc:
    return {"queue": queue, "job_id": job_id}


def journals_of(queue: str, job_ids: Sequence[str]) -> Doc:
    """These jobs' journals (``JOURNAL_INDEX``: an equality on the event would be read and
    dropped all the same, and no index holds it)."""
    return {"queue": queue, "job_id": {"$in": list(job_ids)}}


# --- pipeline updates ----------------------------------------------------------------------


def claim(worker_id: str, lease_s: float, offset_s: float, token: str) -> list[Doc]:
    """The claim; a stale job (taken over from an expired lease) starts afresh, as reclaim
    and a stale finish would start it: its first attempt, no snoozes, no give-backs. It
    stamps the job with ``token`` (``new_claim_token``: one per claim call; ``Lease``)."""
    def afresh(value: Any, otherwise: Any) -> Doc:
        return {"$cond": [is_stale(), value, otherwise]}

    return [{"$set": {
        "status": PROCESSING,
        "worker_id": lit(worker_id),
        "claim_token": lit(token),
        "lease_until": now(offset_s, lease_s),
        "attempts": afresh(1, {"$add": [attempts(), 1]}),
        "snoozes": afresh(0, "$snoozes"),
        "givebacks": afresh(0, "$givebacks"),
        "lease_epoch": {"$add": [{"$ifNull": ["$lease_epoch", 0]}, 1]},
        "max_attempts": max_attempts(),
        "stale": False,
        "concurrency_key": key_after_revision(),
        "updated_at": now(offset_s),
        "first_seen_at": first_seen(offset_s),
    }}]


def new_claim_token() -> str:
    """A claim call's token: 128 random bits as 32 hex digits."""
    return uuid.uuid4().hex


def extend(lease_s: float, offset_s: float) -> list[Doc]:
    return [{"$set": {"lease_until": now(offset_s, lease_s)}}]


def complete(status: str, result_json: str | None, result_key: str | None,
             offset_s: float) -> list[Doc]:
    # The result is kept as its JSON text: a result's keys may hold '$' or '.'.
    return [{"$set": {
        "status": lit(status), "result": lit(result_json), "result_key": lit(result_key),
        "failure": None, "lease_until": None, "updated_at": now(offset_s),
    }}]


def retry_later(error: str, delay_s: float, offset_s: float) -> list[Doc]:
    """Back to pending after ``delay_s``, or ``failed(exhausted)`` when attempts are spent."""
    def pick(if_spent: Any, otherwise: Any) -> Doc:
        return {"$cond": [spent(), if_spent, otherwise]}

    return [{"$set": {
        "status": pick("failed", PENDING),
        "failure": pick("exhausted", None),
        "error": lit(error),
        "lease_until": pick(None, now(offset_s, delay_s)),
        "published_at": pick("$published_at", None),
        "updated_at": now(offset_s),
    }}]


def snooze(delay_s: float, max_snoozes: int, offset_s: float) -> list[Doc]:
    """Back to pending after ``delay_s`` with the attempt given back and the snooze counted;
    past ``max_snoozes`` the job is ``failed(exhausted)`` instead, so a condition that never
    clears cannot loop for ever."""
    counted = {"$add": [snoozes(), 1]}
    over = {"$gt": [counted, max_snoozes]}

    def pick(if_over: Any, otherwise: Any) -> Doc:
        return {"$cond": [over, if_over, otherwise]}

    return [{"$set": {
        "status": pick(FAILED, PENDING),
        "failure": pick("exhausted", None),
        "error": pick({"$concat": filled(SNOOZED_OUT, n=counted)}, "$error"),
        "snoozes": counted,
        "attempts": pick(attempts(), refunded()),
        "lease_until": pick(None, now(offset_s, delay_s)),
        "published_at": pick("$published_at", None),
        "stale": False,
        "updated_at": now(offset_s),
    }}]


def give_back(started: bool, max_givebacks: int, offset_s: float) -> list[Doc]:
    """Back to pending, ready now, not a snooze (shutdown give-back).

    A handler that never started costs nothing. One that ran is refunded ``max_givebacks``
    times per job (counted in ``givebacks``); after that the give-back spends the attempt
    like any other, and with the attempts spent the job is ``failed(exhausted)``: a job that
    outlives every grace period must still end.
    """
    if not started:
        return [{"$set": {**_ready_again(offset_s), "attempts": refunded()}}]
    free = {"$lt": [givebacks(), max_givebacks]}
    out = {"$and": [{"$not": [free]}, spent()]}

    def pick(if_out: Any, otherwise: Any) -> Doc:
        return {"$cond": [out, if_out, otherwise]}

    ready = _ready_again(offset_s)
    return [{"$set": {
        **ready,
        "status": pick(FAILED, PENDING),
        "failure": pick("exhausted", None),
        "error": pick({"$concat": filled(GIVEN_BACK_OUT, n=givebacks())}, "$error"),
        "attempts": {"$cond": [free, refunded(), attempts()]},
        "givebacks": {"$cond": [free, {"$add": [givebacks(), 1]}, givebacks()]},
        "lease_until": pick(None, ready["lease_until"]),
        "published_at": pick("$published_at", None),
    }}]


def stale_give_back(offset_s: float) -> list[Doc]:
    """What a stale job's finish writes instead: its new revision never ran, so it starts
    afresh (attempts and counters 0), ready now."""
    return [{"$set": {**_ready_again(offset_s), "attempts": 0, "snoozes": 0, "givebacks": 0,
                      "concurrency_key": key_after_revision()}}]


def _ready_again(offset_s: float) -> Doc:
    return {"status": PENDING, "lease_until": now(offset_s), "stale": False,
            "published_at": None, "updated_at": now(offset_s)}


def fail(error: str, failure: str, offset_s: float) -> list[Doc]:
    return [{"$set": {
        "status": "failed", "failure": lit(failure), "error": lit(error),
        "lease_until": None, "updated_at": now(offset_s),
    }}]


def expire_spent(offset_s: float) -> list[Doc]:
    """Reclaim step 1: quarantine with a reason naming the attempt and the worker."""
    worker = {"$cond": [{"$ifNull": ["$worker_id", False]},
                        {"$concat": filled(HELD_BY, worker="$worker_id")}, ""]}
    on = filled(LEASE_EXPIRED_ON, attempt=attempts(), max_attempts=max_attempts())
    return [{"$set": {
        "status": "failed", "failure": "expired", "lease_until": None,
        "error": {"$concat": [*on, worker]},
        "updated_at": now(offset_s),
    }}]


def return_expired(offset_s: float) -> list[Doc]:
    """Reclaim step 2: ready now; a stale job starts afresh (see ``expired``)."""
    def unless_stale(value: Any) -> Doc:
        return {"$cond": [is_stale(), 0, value]}

    return [{"$set": {**_ready_again(offset_s), "attempts": unless_stale(attempts()),
                      "snoozes": unless_stale(snoozes()),
                      "givebacks": unless_stale(givebacks()),
                      "concurrency_key": key_after_revision()}}]


def exhaust_pending(offset_s: float) -> list[Doc]:
    """Reclaim step 3: quarantine a pending job whose attempts are spent."""
    return [{"$set": {
        "status": FAILED, "failure": "exhausted", "lease_until": None,
        "error": {"$concat": filled(SPENT_WHILE_PENDING_ERROR, attempt=attempts(),
                                    max_attempts=max_attempts())},
        "updated_at": now(offset_s),
    }}]


def operator_requeue(offset_s: float) -> list[Doc]:
    return [{"$set": {"status": PENDING, "attempts": 0, "snoozes": 0, "givebacks": 0,
                      "failure": None, "stale": False, "worker_id": None,
                      "lease_until": now(offset_s), "published_at": None,
                      "updated_at": now(offset_s)}}]


def operator_cancel(offset_s: float) -> list[Doc]:
    return [{"$set": {"status": "cancelled", "lease_until": None, "stale": False,
                      "concurrency_key": key_after_revision(), "updated_at": now(offset_s)}}]


def mark_published(offset_s: float) -> list[Doc]:
    return [{"$set": {"published_at": now(offset_s)}}]


def stamped(update: list[Doc], token: Any) -> list[Doc]:
    """``update`` that also writes ``moved_by``: the token of the one ``update_many`` that
    changed the document (``MongoStore._move``), so a read can tell its documents from
    those another call moved the same way."""
    return [*update, {"$set": {"moved_by": lit(token)}}]


def stamped_by(job_ids: Sequence[str], token: Any) -> Doc:
    """Those of ``job_ids`` the update of ``token`` changed (served by the ``_id`` index)."""
    return {"_id": {"$in": list(job_ids)}, "moved_by": token}


def journal_entry(queue: str, job_id: str, event: str, fields: Mapping[str, Any],
                  offset_s: float) -> list[Doc]:
    """An upsert of a new ``_id``: the only way to stamp an inserted document with ``$$NOW``."""
    values = {k: lit(v) for k, v in fields.items()}
    return [{"$set": {"queue": lit(queue), "job_id": lit(job_id), "event": lit(event),
                      **values, "at": now(offset_s)}}]


# --- projections, aggregations, indexes ----------------------------------------------------

FENCE_PROJECTION = {"status": 1, "lease_epoch": 1, "attempts": 1, "max_attempts": 1,
                    "worker_id": 1, "claim_token": 1, "stale": 1}


def counts() -> list[Doc]:
    """Jobs per status. Sorted by ``status`` first, so that the planner reads the status
    index alone (the group needs no other field) instead of every document."""
    return [{"$sort": {"status": 1}}, {"$group": {"_id": "$status", "n": {"$sum": 1}}}]


def ready(offset_s: float) -> list[Doc]:
    """How many are claimable and since when the oldest one is (in ms, server clock)."""
    since = {"$ifNull": ["$lease_until", {"$ifNull": ["$created_at", "$updated_at"]}]}
    return [
        {"$match": claimable(offset_s)},
        {"$group": {"_id": None, "n": {"$sum": 1}, "since": {"$min": since}}},
        {"$project": {"_id": 0, "n": 1, "age_ms": {"$subtract": [now(offset_s), "$since"]}}},
    ]


def payload_of(doc: Mapping[str, Any]) -> Doc:
    """The payload of a stored job: every top-level field that is not the record's."""
    return {k: v for k, v in doc.items() if k not in RECORD_KEYS}


def published(job_ids: Sequence[str]) -> Doc:
    """Those of ``job_ids`` still pending with a publish marked (``reowe_publish``)."""
    return {"_id": {"$in": list(job_ids)}, "status": PENDING, "published_at": {"$type": "date"}}
