"""The idempotent upsert of ``enqueue``, as MongoDB documents (pure, no I/O; see documents.py
for the rules every builder keeps).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import bson

from leaseq.errors import InvalidPayload
from leaseq.job import JobSpec
from leaseq.stores.mongodb.connection import MAX_DOCUMENT_BYTES, too_large
from leaseq.stores.mongodb.documents import (
    PENDING,
    PROCESSING,
    RECORD_FIELDS,
    RECORD_OF_ROOT,
    Doc,
    first_seen,
    lit,
    now,
    payload_of,
)

# --- the idempotent upsert ------------------------------------------------------------------
#
# One find_one_and_update(filter={"_id": id}, upsert=True, return_document=BEFORE) whose
# pipeline decides the outcome from the stored document itself, so a replayed page is a no-op
# even when two producers race. The pre-image comes back, and ``upsert_outcome`` (the same
# decision in Python, over the same fields) says which branch the server took.

CREATE, REVIVE, UPDATE, STALE, KEEP = "create", "revive", "update", "stale", "keep"


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
                  delay_s: float, offset_s: float, priority: int = 0,
                  concurrency_key: str | None = None) -> Doc:
    """The record's fields each branch writes (the payload is written beside them)."""
    clock, not_before = now(offset_s), now(offset_s, delay_s)
    spec = {"task": lit(task), "revision": lit(revision), "max_attempts": max_attempts_,
            "priority": priority}
    counters = {"attempts": 0, "snoozes": 0, "givebacks": 0}
    if op == STALE:  # the lease is left alone; the worker's finish becomes a snooze. The
        # running attempt was the old revision's: the budget starts afresh now, as on the SQL
        # stores (mark_stale). The key stays while it runs (the key's running count must not
        # move): the new one waits in next_concurrency_key (documents.key_after_revision).
        return {**spec, **counters, "stale": True,
                "next_concurrency_key": lit(concurrency_key), "updated_at": clock}
    spec["concurrency_key"] = lit(concurrency_key)
    if op == UPDATE:  # a new revision starts afresh: the old attempts were on other input
        return {**spec, **counters, "lease_until": not_before, "published_at": None,
                "updated_at": clock}
    fresh = {**spec, **counters, "status": PENDING, "failure": None, "result": None,
             "result_key": None, "stale": False, "worker_id": None, "lease_until": not_before,
             "published_at": None, "updated_at": clock, "first_seen_at": first_seen(offset_s),
             "created_at": {"$ifNull": ["$created_at", clock]}}
    if op == CREATE:
        fresh.update({"lease_epoch": 0, "error": None})
    return fresh


def upsert(payload: Mapping[str, Any], task: str | None, revision: str | None,
           max_attempts_: int, delay_s: float, on_conflict: str, offset_s: float,
           priority: int = 0, concurrency_key: str | None = None) -> list[Doc]:
    """The pipeline: keep the record's own fields, put the new payload beside them, then the
    branch's fields; ``keep`` returns the document as it was (no write)."""
    branches = [
        {"case": {"$eq": ["$$op", op]},
         "then": {"$mergeObjects": [RECORD_OF_ROOT, lit(dict(payload)), upsert_fields(
             op, task, revision, max_attempts_, delay_s, offset_s, priority,
             concurrency_key)]}}
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


#: BSON's widest integer is 8 bytes; a JSON number of 19 digits or more may not fit in one.
_LONG_DIGITS = re.compile(r"\d{19,}")
INT64 = range(-(2**63), 2**63)


def refuse_unstorable(specs: Sequence[JobSpec]) -> None:
    """``InvalidPayload`` for a job enqueue would refuse whatever the stored state: an
    integer wider than BSON's, or an upsert over MongoDB's limit on one document (it carries
    the payload once in each branch of its pipeline, so that limit binds first), which the
    driver or the server refuse. For a caller that must not write before the enqueue (the
    schedule ledger's intent); it encodes each upsert once more, so not enqueue's own path."""
    refuse_wide_integers(specs)
    for spec in specs:
        command = {"q": {"_id": spec.job_id}, "u": upsert(
            json.loads(spec.payload_json), spec.task, spec.revision, spec.max_attempts,
            spec.delay_s, "keep", 0.0, spec.priority, spec.concurrency_key)}
        size = len(bson.encode(command))
        if size > MAX_DOCUMENT_BYTES:
            raise too_large(f"job {spec.job_id[:200]!r}: its upsert is {size} bytes")


def refuse_wide_integers(specs: Sequence[JobSpec]) -> None:
    """Before anything is written: a payload integer BSON cannot hold (beyond 8 bytes) is
    ``InvalidPayload`` (pymongo would raise a bare OverflowError mid-batch)."""
    for spec in specs:
        if wider_than_bson(spec.payload_json, spec.payload):
            raise InvalidPayload(f"job {spec.job_id[:200]!r}: MongoDB stores integers of at most "
                                 "8 bytes (-2**63 to 2**63 - 1); send a wider one as a string")



def wider_than_bson(payload_json: str, payload: Any) -> bool:
    """Whether ``payload`` holds an integer BSON cannot store (beyond 8 bytes). The walk runs
    only when its JSON holds a run of 19 digits or more, so a plain payload costs one scan."""
    return _LONG_DIGITS.search(payload_json) is not None and _holds_wide_int(payload)


def _holds_wide_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value not in INT64
    if isinstance(value, Mapping):
        return any(_holds_wide_int(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_holds_wide_int(v) for v in value)
    return False
