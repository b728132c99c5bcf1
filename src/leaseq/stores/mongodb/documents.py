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

import json
from collections.abc import Mapping, Sequence
from typing import Any

from leaseq.validate import RESERVED_KEYS

#: What a document without ``max_attempts`` gets (DESIGN.md §2's default).
DEFAULT_MAX_ATTEMPTS = 5
PENDING, PROCESSING = "pending", "processing"
#: Fields of the record kept when a new payload replaces the old one (the rest is payload).
RECORD_FIELDS = sorted(RESERVED_KEYS)
CLAIM_SORT = [("lease_until", 1), ("_id", 1)]
JOURNAL_SORT = [("at", 1), ("_id", 1)]
STALE_REASON = "stale revision: the payload changed while this attempt ran"

Doc = dict[str, Any]


# --- expressions ---------------------------------------------------------------------------


def lit(value: Any) -> Doc:
    """A caller's value, never read as a field path or an operator."""
    return {"$literal": value}


def now(offset_s: float, plus_s: float = 0.0) -> Doc:
    """The server clock plus the test offset and ``plus_s``, to the millisecond."""
    return {"$dateAdd": {"startDate": "$$NOW", "unit": "millisecond",
                         "amount": round((offset_s + plus_s) * 1000)}}


def attempts() -> Doc:
    return {"$ifNull": ["$attempts", 0]}


def max_attempts() -> Doc:
    return {"$ifNull": ["$max_attempts", DEFAULT_MAX_ATTEMPTS]}


def first_seen(offset_s: float) -> Doc:
    # $ifNull instead of $setOnInsert: an upsert that also $sets the field would conflict.
    return {"$ifNull": ["$first_seen_at", now(offset_s)]}


# --- filters -------------------------------------------------------------------------------


def has_attempts_left() -> Doc:
    return {"$expr": {"$lt": [attempts(), max_attempts()]}}


def claimable(offset_s: float) -> Doc:
    """DESIGN.md §3: attempts left and (fresh, due, or an expired lease)."""
    clock = now(offset_s)
    return {
        **has_attempts_left(),
        "$or": [
            {"status": PENDING, "lease_until": None},
            {"status": PENDING, "lease_until": {"$type": "date"},
             "$expr": {"$lte": ["$lease_until", clock]}},
            {"status": PROCESSING, "lease_until": {"$type": "date"},
             "$expr": {"$lt": ["$lease_until", clock]}},
        ],
    }


def claimable_id(job_id: str, offset_s: float) -> Doc:
    return {"_id": job_id, **claimable(offset_s)}


def fenced(job_id: str, lease_epoch: int, stale: bool | None = None) -> Doc:
    """The guard of every write after a claim. ``stale`` splits a finish from its snooze."""
    guard: Doc = {"_id": job_id, "lease_epoch": lease_epoch, "status": PROCESSING}
    if stale is True:
        guard["stale"] = True
    elif stale is False:
        guard["stale"] = {"$ne": True}
    return guard


def held(leases: Sequence[tuple[str, int]]) -> Doc:
    """Heartbeat: the leases of this list still held (``$in`` narrows, ``$or`` fences)."""
    return {
        "_id": {"$in": [job_id for job_id, _ in leases]},
        "status": PROCESSING,
        "$or": [{"_id": job_id, "lease_epoch": epoch} for job_id, epoch in leases],
    }


def expired(offset_s: float, spent: bool) -> Doc:
    """Reclaim: processing with a lapsed lease, attempts spent (step 1) or left (step 2)."""
    spent_expr = {"$gte": [attempts(), max_attempts()]}
    return {
        "status": PROCESSING,
        "lease_until": {"$type": "date"},
        "$expr": {"$and": [
            {"$lt": ["$lease_until", now(offset_s)]},
            spent_expr if spent else {"$not": [spent_expr]},
        ]},
    }


def outbox_due(offset_s: float) -> Doc:
    return {
        **has_attempts_left(),
        "status": PENDING,
        "published_at": None,
        "$or": [{"lease_until": None},
                {"lease_until": {"$type": "date"},
                 "$expr": {"$lte": ["$lease_until", now(offset_s)]}}],
    }


def published_before(published_before_s: float, offset_s: float) -> Doc:
    """Pending jobs whose publish is older than ``published_before_s`` (a lost message)."""
    return {"status": PENDING, "published_at": {"$type": "date"},
            "$expr": {"$lt": ["$published_at", now(offset_s, -published_before_s)]}}


def unpublish() -> list[Doc]:
    return [{"$set": {"published_at": None}}]


def unpublished(leases: Sequence[tuple[str, int]], offset_s: float) -> Doc:
    """Only the state that was published: still pending, unpublished and due, at the epoch
    outbox_due read (a claim and give-back in between bumped it; that later pending state is
    owed its own publish). A document without ``lease_epoch`` is at epoch 0."""
    at_epoch: list[Doc] = []
    for job_id, epoch in leases:
        at_epoch.append({"_id": job_id, "lease_epoch": epoch})
        if epoch == 0:
            at_epoch.append({"_id": job_id, "lease_epoch": {"$exists": False}})
    due = outbox_due(offset_s)
    return {"_id": {"$in": [job_id for job_id, _ in leases]}, "status": PENDING,
            "published_at": None, "$and": [{"$or": at_epoch}, {"$or": due["$or"]}]}


def operator_retryable(job_id: str) -> Doc:
    return {"_id": job_id, "status": {"$nin": [PENDING, PROCESSING]}}


def cancellable(job_id: str) -> Doc:
    return {"_id": job_id, "status": {"$in": [PENDING, PROCESSING, "failed"]}}


def purgeable(status: str, older_than_s: float, offset_s: float) -> Doc:
    return {"status": status,
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


# --- pipeline updates ----------------------------------------------------------------------


def claim(worker_id: str, lease_s: float, offset_s: float) -> list[Doc]:
    return [{"$set": {
        "status": PROCESSING,
        "worker_id": lit(worker_id),
        "lease_until": now(offset_s, lease_s),
        "attempts": {"$add": [attempts(), 1]},
        "lease_epoch": {"$add": [{"$ifNull": ["$lease_epoch", 0]}, 1]},
        "max_attempts": max_attempts(),
        "stale": False,
        "updated_at": now(offset_s),
        "first_seen_at": first_seen(offset_s),
    }}]


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
    spent = {"$gte": [attempts(), max_attempts()]}

    def pick(if_spent: Any, otherwise: Any) -> Doc:
        return {"$cond": [spent, if_spent, otherwise]}

    return [{"$set": {
        "status": pick("failed", PENDING),
        "failure": pick("exhausted", None),
        "error": lit(error),
        "lease_until": pick(None, now(offset_s, delay_s)),
        "published_at": pick("$published_at", None),
        "updated_at": now(offset_s),
    }}]


def snooze(delay_s: float, offset_s: float) -> list[Doc]:
    return [{"$set": {
        "status": PENDING,
        "attempts": {"$max": [{"$subtract": [attempts(), 1]}, 0]},
        "lease_until": now(offset_s, delay_s),
        "stale": False,
        "published_at": None,
        "updated_at": now(offset_s),
    }}]


def fail(error: str, failure: str, offset_s: float) -> list[Doc]:
    return [{"$set": {
        "status": "failed", "failure": lit(failure), "error": lit(error),
        "lease_until": None, "updated_at": now(offset_s),
    }}]


def expire_spent(offset_s: float) -> list[Doc]:
    """Reclaim step 1: quarantine with a reason naming the attempt and the worker."""
    worker = {"$cond": [{"$ifNull": ["$worker_id", False]},
                        {"$concat": [" (worker ", {"$toString": "$worker_id"}, ")"]}, ""]}
    return [{"$set": {
        "status": "failed", "failure": "expired", "lease_until": None,
        "error": {"$concat": ["lease expired on attempt ", {"$toString": attempts()}, " of ",
                              {"$toString": max_attempts()}, worker]},
        "updated_at": now(offset_s),
    }}]


def return_expired(offset_s: float) -> list[Doc]:
    """Reclaim step 2: ready now."""
    return [{"$set": {"status": PENDING, "lease_until": now(offset_s), "stale": False,
                      "published_at": None, "updated_at": now(offset_s)}}]


def operator_retry(offset_s: float) -> list[Doc]:
    return [{"$set": {"status": PENDING, "attempts": 0, "failure": None, "stale": False,
                      "worker_id": None, "lease_until": now(offset_s), "published_at": None,
                      "updated_at": now(offset_s)}}]


def operator_cancel(offset_s: float) -> list[Doc]:
    return [{"$set": {"status": "cancelled", "lease_until": None, "stale": False,
                      "updated_at": now(offset_s)}}]


def mark_published(offset_s: float) -> list[Doc]:
    return [{"$set": {"published_at": now(offset_s)}}]


def journal_entry(queue: str, job_id: str, event: str, fields: Mapping[str, Any],
                  offset_s: float) -> list[Doc]:
    """An upsert of a new ``_id``: the only way to stamp an inserted document with ``$$NOW``."""
    values = {k: lit(v) for k, v in fields.items()}
    return [{"$set": {"queue": lit(queue), "job_id": lit(job_id), "event": lit(event),
                      **values, "at": now(offset_s)}}]


# --- projections, aggregations, indexes ----------------------------------------------------

FENCE_PROJECTION = {"status": 1, "lease_epoch": 1, "attempts": 1, "worker_id": 1}


def counts() -> list[Doc]:
    return [{"$group": {"_id": "$status", "n": {"$sum": 1}}}]


def ready(offset_s: float) -> list[Doc]:
    """How many are claimable and since when the oldest one is (in ms, server clock)."""
    since = {"$ifNull": ["$lease_until", {"$ifNull": ["$created_at", "$updated_at"]}]}
    return [
        {"$match": claimable(offset_s)},
        {"$group": {"_id": None, "n": {"$sum": 1}, "since": {"$min": since}}},
        {"$project": {"_id": 0, "n": 1, "age_ms": {"$subtract": [now(offset_s), "$since"]}}},
    ]


def job_indexes(ttl_s: Mapping[str, float]) -> list[tuple[list[tuple[str, int]], Doc]]:
    """``(keys, options)`` per index. A TTL index always has a ``partialFilterExpression``:
    a bare TTL index on ``updated_at`` would delete every job, live ones included."""
    specs: list[tuple[list[tuple[str, int]], Doc]] = [
        ([("status", 1), ("lease_until", 1)], {"name": "status_1_lease_until_1"}),
    ]
    for status, seconds in sorted(ttl_s.items()):
        specs.append(([("updated_at", 1)], {
            "name": f"leaseq_ttl_{status}",
            "expireAfterSeconds": int(seconds),
            "partialFilterExpression": {"status": status},
        }))
    return specs


def journal_indexes() -> list[tuple[list[tuple[str, int]], Doc]]:
    return [([("queue", 1), ("job_id", 1), ("at", 1)], {"name": "queue_1_job_id_1_at_1"})]


# --- the idempotent upsert ------------------------------------------------------------------
#
# One find_one_and_update(filter={"_id": id}, upsert=True, return_document=BEFORE) whose
# pipeline decides the outcome from the stored document itself, so a replayed page is a no-op
# even when two producers race. The pre-image comes back, and ``upsert_outcome`` (the same
# decision in Python, over the same fields) says which branch the server took.

CREATE, REVIVE, UPDATE, STALE, KEEP = "create", "revive", "update", "stale", "keep"


def payload_of(doc: Mapping[str, Any]) -> Doc:
    """The payload of a stored job: every top-level field that is not the record's."""
    return {k: v for k, v in doc.items() if k not in RESERVED_KEYS}


def same_payload(payload: Mapping[str, Any]) -> Doc:
    """Server side: the stored payload equals ``payload`` (top-level keys in any order;
    nested documents compare field by field in order, as BSON does)."""
    stored = {"$filter": {"input": {"$objectToArray": "$$ROOT"},
                          "cond": {"$not": [{"$in": ["$$this.k", RECORD_FIELDS]}]}}}
    checks: list[Doc] = [{"$eq": [{"$size": stored}, len(payload)]}]
    for key, value in payload.items():
        checks.append({"$eq": [{"$getField": {"field": lit(key), "input": "$$ROOT"}},
                               lit(value)]})
    return {"$and": checks}


def upsert_op(payload: Mapping[str, Any], revision: str | None, on_conflict: str) -> Doc:
    """Which branch: create (no document), keep, or by status revive / stale / update."""
    if revision is not None:
        changed: Any = {"$ne": ["$revision", lit(revision)]}
    elif on_conflict == "replace":
        changed = {"$not": [same_payload(payload)]}
    else:  # same payload → unchanged; other payload → conflict: neither writes
        changed = False
    by_status = {"$switch": {"branches": [
        {"case": {"$eq": ["$status", PENDING]}, "then": UPDATE},
        {"case": {"$eq": ["$status", PROCESSING]}, "then": STALE},
    ], "default": REVIVE}}
    return {"$switch": {"branches": [
        {"case": {"$eq": [{"$type": "$status"}, "missing"]}, "then": CREATE},
        {"case": changed, "then": by_status},
    ], "default": KEEP}}


def upsert_fields(op: str, task: str | None, revision: str | None, max_attempts_: int,
                  delay_s: float, offset_s: float) -> Doc:
    """The record's fields each branch writes (the payload is written beside them)."""
    clock, not_before = now(offset_s), now(offset_s, delay_s)
    spec = {"task": lit(task), "revision": lit(revision), "max_attempts": max_attempts_}
    if op == STALE:  # the lease is left alone; the worker's finish becomes a snooze
        return {**spec, "stale": True, "updated_at": clock}
    if op == UPDATE:
        return {**spec, "lease_until": not_before, "published_at": None, "updated_at": clock}
    fresh = {**spec, "status": PENDING, "attempts": 0, "failure": None, "result": None,
             "result_key": None, "stale": False, "worker_id": None, "lease_until": not_before,
             "published_at": None, "updated_at": clock, "first_seen_at": first_seen(offset_s),
             "created_at": {"$ifNull": ["$created_at", clock]}}
    if op == CREATE:
        fresh.update({"lease_epoch": 0, "error": None})
    return fresh


def upsert(payload: Mapping[str, Any], task: str | None, revision: str | None,
           max_attempts_: int, delay_s: float, on_conflict: str, offset_s: float) -> list[Doc]:
    """The pipeline: keep the record's own fields, put the new payload beside them, then the
    branch's fields; ``keep`` returns the document as it was (no write)."""
    record = {"$arrayToObject": {"$filter": {"input": {"$objectToArray": "$$ROOT"},
                                             "cond": {"$in": ["$$this.k", RECORD_FIELDS]}}}}
    branches = [
        {"case": {"$eq": ["$$op", op]},
         "then": {"$mergeObjects": [record, lit(dict(payload)), upsert_fields(
             op, task, revision, max_attempts_, delay_s, offset_s)]}}
        for op in (CREATE, REVIVE, UPDATE, STALE)
    ]
    return [{"$replaceWith": {"$let": {
        "vars": {"op": upsert_op(payload, revision, on_conflict)},
        "in": {"$switch": {"branches": branches, "default": "$$ROOT"}},
    }}}]


def upsert_outcome(before: Mapping[str, Any] | None, payload: Mapping[str, Any],
                   revision: str | None, on_conflict: str) -> str:
    """``upsert_op`` evaluated in Python on the pre-image; ``conflict`` where the server
    kept the document because the payload differs and there is no revision."""
    if before is None or "status" not in before:
        return CREATE
    if revision is not None:
        if before.get("revision") == revision:
            return KEEP
    elif bson_equal_payload(payload_of(before), payload):
        return KEEP
    elif on_conflict != "replace":
        return "conflict"
    status = before.get("status")
    return UPDATE if status == PENDING else STALE if status == PROCESSING else REVIVE


def batch_conflicts(stored: Mapping[str, Mapping[str, Any]], specs: Sequence[Any]) -> list[str]:
    """The ids of ``specs`` (``JobSpec``) that conflict, replaying the batch in order over the
    stored documents by id, so a later spec sees what an earlier one would write."""
    state = dict(stored)
    conflicts = []
    for spec in specs:
        payload = json.loads(spec.payload_json)
        op = upsert_outcome(state.get(spec.job_id), payload, spec.revision, "raise")
        if op == "conflict":
            conflicts.append(spec.job_id)
        elif op != KEEP:
            status = PROCESSING if op == STALE else PENDING
            state[spec.job_id] = {**payload, "status": status, "revision": spec.revision}
    return conflicts


def bson_equal_payload(stored: Mapping[str, Any], given: Mapping[str, Any]) -> bool:
    """``same_payload`` in Python: top level by key, below it as BSON compares."""
    return stored.keys() == given.keys() and all(
        _bson_equal(stored[k], given[k]) for k in given)


def _bson_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return list(a.keys()) == list(b.keys()) and all(
            _bson_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_bson_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def published(job_ids: Sequence[str]) -> Doc:
    """Those of ``job_ids`` still pending with a publish marked (``reowe_publish``)."""
    return {"_id": {"$in": list(job_ids)}, "status": PENDING, "published_at": {"$type": "date"}}
