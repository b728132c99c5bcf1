"""The indexes of the MongoDB store, and the rule that says whether one serves a query.

Every filter and sort the store sends must be served by one of these indexes (the unit tests
check each query the store sends with ``unserved``), so no claim, outbox read or count walks
documents it does not need. The rule is MongoDB's ESR rule: an index serves a query when its
key pattern is the query's **E**quality fields, then its **S**ort fields, then its **R**ange
fields. A range on a sort key is served by the sort itself (the index is read in that order,
within the bounds), and an equality on a field among the sort keys is one point of it, which
keeps the order. A query with an equality on ``_id`` is served by the ``_id`` index.

A rooted ``$or`` is planned by MongoDB as one index scan per branch, merged in sort order when
every branch's scan yields the sort (``SORT_MERGE``); so each branch must be served on its own,
with the query's other conditions joined into it.

Conditions no index can bound are left to the fetch that follows the index scan, and are not
asked of an index: ``$ne`` / ``$nin`` / ``$exists`` / ``$not``, and ``$expr`` terms that compare
two fields (``attempts < max_attempts``). An ``$expr`` comparison of one field with a constant
(``lease_until <= $$NOW``) is a range on that field, as MongoDB 5.0 rewrites it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

Key = tuple[str, int]
IndexSpec = tuple[list[Key], dict[str, Any]]

#: The claim, ``ready``, ``in_flight`` and both reclaim steps: equality on ``status`` (and on
#: ``lease_until: null``), the claim's sort, the not-before / lease range on its first key.
CLAIM_INDEX: list[Key] = [("status", 1), ("priority", -1), ("lease_until", 1), ("_id", 1)]
#: A key-limited claim: the live keys with their running counts, then each key's first
#: claimable jobs in claim order. Partial: only documents with a key are in it.
KEYED_INDEX: list[Key] = [("status", 1), ("concurrency_key", 1), ("priority", -1),
                          ("lease_until", 1), ("_id", 1)]
#: ``outbox_due`` (pending, unpublished, in claim order) and ``republish`` (published long ago).
OUTBOX_INDEX: list[Key] = [("status", 1), ("published_at", 1), ("lease_until", 1), ("_id", 1)]
#: Reclaim step 3, pending jobs with attempts spent: only jobs claimed at least once are read.
SPENT_INDEX: list[Key] = [("status", 1), ("attempts", 1)]
#: ``list(status=…)``: one status in id order, one page at a time.
LISTING_INDEX: list[Key] = [("status", 1), ("_id", 1)]
#: ``purge``: one terminal status older than a cut-off.
PURGE_INDEX: list[Key] = [("status", 1), ("updated_at", 1)]
#: A job's journal in order.
JOURNAL_INDEX: list[Key] = [("queue", 1), ("job_id", 1), ("at", 1), ("_id", 1)]
ID_INDEX: list[Key] = [("_id", 1)]
#: The job browser: one status newest first (keyset on ``updated_at``, ``_id``).
RECENT_INDEX: list[Key] = [("status", 1), ("updated_at", 1), ("_id", 1)]
#: The job browser: one task in id order (a task is written at enqueue only).
TASK_INDEX: list[Key] = [("task", 1), ("_id", 1)]
#: Journal counts per hour: one queue's events from a time on.
JOURNAL_TIME_INDEX: list[Key] = [("queue", 1), ("at", 1)]

_EQUALITY_OPS = {"$eq", "$in"}
_RANGE_OPS = {"$gt", "$gte", "$lt", "$lte", "$type"}
_EXPR_RANGE_OPS = {"$gt", "$gte", "$lt", "$lte"}


#: The name of leaseq's TTL index of a status is this and the status.
TTL_INDEX_PREFIX = "leaseq_ttl_"


def name_of(keys: Sequence[Key]) -> str:
    """MongoDB's default index name (``status_1_lease_until_1``), so an adopted collection's
    index of the same keys is recognised as ours."""
    return "_".join(f"{field}_{direction}" for field, direction in keys)


def job_indexes(ttl_s: Mapping[str, float]) -> list[IndexSpec]:
    """``(keys, options)`` per index. A TTL index always has a ``partialFilterExpression``:
    a bare TTL index on ``updated_at`` would delete every job, live ones included."""
    specs: list[IndexSpec] = [
        (keys, {"name": name_of(keys)})
        for keys in (CLAIM_INDEX, OUTBOX_INDEX, SPENT_INDEX, LISTING_INDEX, PURGE_INDEX,
                     RECENT_INDEX, TASK_INDEX)
    ]
    specs.append((KEYED_INDEX, {"name": name_of(KEYED_INDEX), "partialFilterExpression": {
        "concurrency_key": {"$type": "string"}}}))  # documents.HAS_KEY
    for status, seconds in sorted(ttl_s.items()):
        specs.append(([("updated_at", 1)], {
            "name": f"{TTL_INDEX_PREFIX}{status}",
            "expireAfterSeconds": int(seconds),
            "partialFilterExpression": {"status": status},
        }))
    return specs


def journal_indexes() -> list[IndexSpec]:
    return [(keys, {"name": name_of(keys)}) for keys in (JOURNAL_INDEX, JOURNAL_TIME_INDEX)]


# --- the ESR rule ----------------------------------------------------------------------------


def unserved(query: Mapping[str, Any], sort: Sequence[Key],
             indexes: Sequence[Sequence[Key]]) -> list[list[tuple[str, Any]]]:
    """The branches of ``query`` (sorted by ``sort``) that no index of ``indexes`` serves;
    ``[]`` when the query is served. The ``_id`` index is always there."""
    candidates = [*indexes, ID_INDEX]
    return [branch for branch in branches(query)
            if not any(serves(index, branch, sort) for index in candidates)]


def serves(index: Sequence[Key], branch: Sequence[tuple[str, Any]], sort: Sequence[Key]) -> bool:
    """Whether ``index`` serves one ``$or``-free branch (``(field, condition)`` pairs)."""
    equal, ranged = classify(branch)
    if "_id" in equal:
        return list(index) == ID_INDEX
    fields = [field for field, _ in index]
    prefix = 0
    while prefix < len(fields) and fields[prefix] in equal:
        prefix += 1
    wanted = [(field, way) for field, way in sort if field not in equal]
    rest = list(index[prefix:])
    # A field with an equality among the sort keys is one point: it keeps the order.
    sort_keys: list[Key] = []
    end = 0
    while end < len(rest) and len(sort_keys) < len(wanted):
        if rest[end][0] not in equal:
            sort_keys.append(rest[end])
        end += 1
    if not _same_order(sort_keys, wanted):
        return False
    # An equality or a range on a later key is a bound of the scan in that key (MongoDB
    # seeks past what it leaves out), as long as the scan is bounded from its first key.
    asked = equal | ranged
    return not asked or (fields[0] in asked and asked <= set(fields))


def _same_order(keys: list[Key], wanted: list[Key]) -> bool:
    """The index yields ``wanted``, read forwards or backwards."""
    if [f for f, _ in keys] != [f for f, _ in wanted]:
        return False
    ways = {a * b for (_, a), (_, b) in zip(keys, wanted, strict=True)}
    return len(ways) <= 1


def branches(query: Mapping[str, Any]) -> list[list[tuple[str, Any]]]:
    """The query in disjunctive form: one list of ``(field, condition)`` per ``$or`` branch,
    each with the conditions around the ``$or`` (and inside ``$and``) joined in."""
    plain = [(k, v) for k, v in query.items() if k not in ("$or", "$and")]
    found = [plain]
    for clause in query.get("$and", []):
        found = [a + b for a in found for b in branches(clause)]
    if "$or" in query:
        found = [a + b for a in found for option in query["$or"] for b in branches(option)]
    return found


def classify(branch: Sequence[tuple[str, Any]]) -> tuple[set[str], set[str]]:
    """``(equality fields, range fields)`` an index can bound; the rest is left to the fetch."""
    equal: set[str] = set()
    ranged: set[str] = set()
    for field, condition in branch:
        if field == "$expr":
            for kind, name in _expr_terms(condition):
                (equal if kind == "eq" else ranged).add(name)
        elif not field.startswith("$"):
            condition_kind = _condition_kind(condition)
            if condition_kind is not None:
                (equal if condition_kind == "eq" else ranged).add(field)
    return equal, ranged - equal


def _condition_kind(condition: Any) -> str | None:
    if not isinstance(condition, Mapping) or not any(k.startswith("$") for k in condition):
        return "eq"  # a value, null included: {"lease_until": None} is an equality on null
    ops = set(condition)
    if ops <= _EQUALITY_OPS:
        return "eq"
    if ops <= _RANGE_OPS:
        return "range"
    return None  # $ne, $nin, $exists, $not: no useful bounds


def _expr_terms(expr: Any) -> Iterator[tuple[str, str]]:
    """The field-versus-constant comparisons of an ``$expr`` (under ``$and``)."""
    if not isinstance(expr, Mapping) or len(expr) != 1:
        return
    (op, args), = expr.items()
    if op == "$and":
        for term in args:
            yield from _expr_terms(term)
    elif op in _EXPR_RANGE_OPS | {"$eq"} and isinstance(args, list) and len(args) == 2:
        fields = [a[1:] for a in args if _is_field_path(a)]
        constants = [a for a in args if not _refers_to_fields(a)]
        if len(fields) == 1 and len(constants) == 1:
            yield ("eq" if op == "$eq" else "range"), fields[0]


def _is_field_path(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("$") and not value.startswith("$$")


def _refers_to_fields(value: Any) -> bool:
    if _is_field_path(value):
        return True
    if isinstance(value, Mapping):
        if "$literal" in value:
            return False
        return any(_refers_to_fields(v) for v in value.values())
    if isinstance(value, list):
        return any(_refers_to_fields(v) for v in value)
    return False
