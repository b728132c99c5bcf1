"""A small model of the MongoDB query and aggregation semantics the store's documents use, to
run their logic on sample documents here (no server can run here; see mongo_fakes.py).

Only the operators the store sends, with MongoDB's documented rules for them: a missing field
is not null but ``$ifNull`` and ``{field: null}`` treat both alike; comparisons follow BSON
order across types (null < numbers < strings < objects < arrays < ObjectIds < booleans <
dates); a ``$set`` stage reads every expression from the document as it was before the stage,
and a value that evaluates to missing leaves the field out. Anything else raises, so a builder
that starts using another operator cannot pass unnoticed.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from bson import ObjectId

MISSING = object()
_RANK = [(type(None), 0), (bool, 8), (int, 1), (float, 1), (str, 2), (dict, 3), (list, 4),
         (ObjectId, 7), (datetime, 9)]


def _rank(value: Any) -> int:
    if value is MISSING:
        return 0
    return next(rank for kind, rank in _RANK if isinstance(value, kind))


def _order(a: Any, b: Any) -> int:
    ra, rb = _rank(a), _rank(b)
    if ra != rb or ra == 0:
        return (ra > rb) - (ra < rb)
    return (a > b) - (a < b)


def truthy(value: Any) -> bool:
    return value not in (MISSING, None, False, 0)


def evaluate(expr: Any, doc: Mapping[str, Any], now: datetime) -> Any:
    """An aggregation expression's value over ``doc``."""
    if isinstance(expr, str) and expr.startswith("$$"):
        if expr == "$$NOW":
            return now
        if expr == "$$ROOT":
            return {k: v for k, v in doc.items() if k != _THIS}
        if expr.startswith("$$this."):
            return doc[_THIS].get(expr.removeprefix("$$this."), MISSING)
        raise NotImplementedError(expr)
    if isinstance(expr, str) and expr.startswith("$"):
        return doc.get(expr[1:], MISSING)
    if isinstance(expr, list):
        return [evaluate(item, doc, now) for item in expr]
    if not isinstance(expr, dict):
        return expr
    if len(expr) != 1 or not next(iter(expr)).startswith("$"):
        return {k: evaluate(v, doc, now) for k, v in expr.items()}
    (op, arg), = expr.items()
    if op == "$literal":
        return arg
    return _OPERATORS[op](arg, doc, now)


def _args(arg: Any, doc: Mapping[str, Any], now: datetime) -> list[Any]:
    return [evaluate(a, doc, now) for a in arg]


def _if_null(arg: Any, doc: Mapping[str, Any], now: datetime) -> Any:
    for value in _args(arg, doc, now):
        if value not in (MISSING, None):
            return value
    return None


def _cond(arg: Any, doc: Mapping[str, Any], now: datetime) -> Any:
    test, then, otherwise = arg
    return evaluate(then if truthy(evaluate(test, doc, now)) else otherwise, doc, now)


def _concat(arg: Any, doc: Mapping[str, Any], now: datetime) -> Any:
    parts = _args(arg, doc, now)
    return None if any(p in (MISSING, None) for p in parts) else "".join(parts)


def _to_string(arg: Any, doc: Mapping[str, Any], now: datetime) -> Any:
    value = evaluate(arg, doc, now)
    if value in (MISSING, None):
        return None
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _date_add(arg: Any, doc: Mapping[str, Any], now: datetime) -> Any:
    assert arg["unit"] == "millisecond"
    start = evaluate(arg["startDate"], doc, now)
    return start + timedelta(milliseconds=evaluate(arg["amount"], doc, now))


#: Where ``$filter`` puts the element its condition reads as ``$$this``.
_THIS = "$$this"


def _filter(arg: Any, doc: Mapping[str, Any], now: datetime) -> Any:
    items = evaluate(arg["input"], doc, now)
    return [item for item in items if truthy(evaluate(arg["cond"], {**doc, _THIS: item}, now))]


def _merge_objects(arg: Any, doc: Mapping[str, Any], now: datetime) -> Any:
    merged: dict[str, Any] = {}
    for value in _args(arg, doc, now):
        merged.update(value or {})
    return merged


def _compare(test: Any) -> Any:
    return lambda arg, doc, now: test(_order(*_args(arg, doc, now)))


def _type(arg: Any, doc: Mapping[str, Any], now: datetime) -> str:
    value = evaluate(arg, doc, now)
    if value is MISSING:
        return "missing"
    kinds = [(type(None), "null"), (bool, "bool"), (int, "int"), (float, "double"),
             (str, "string"), (dict, "object"), (list, "array"), (datetime, "date")]
    return next(name for kind, name in kinds if isinstance(value, kind))


_OPERATORS: dict[str, Any] = {
    "$objectToArray": lambda arg, doc, now: [{"k": k, "v": v} for k, v in
                                             evaluate(arg, doc, now).items()],
    "$arrayToObject": lambda arg, doc, now: {i["k"]: i["v"] for i in evaluate(arg, doc, now)},
    "$filter": _filter,
    "$in": lambda arg, doc, now: (lambda v, vs: v in vs)(*_args(arg, doc, now)),
    "$mergeObjects": _merge_objects,
    "$type": _type,
    "$ifNull": _if_null,
    "$cond": _cond,
    "$concat": _concat,
    "$toString": _to_string,
    "$dateAdd": _date_add,
    "$add": lambda arg, doc, now: sum(_args(arg, doc, now)),
    "$subtract": lambda arg, doc, now: (lambda a, b: a - b)(*_args(arg, doc, now)),
    "$max": lambda arg, doc, now: max(v for v in _args(arg, doc, now)
                                      if v not in (MISSING, None)),
    "$and": lambda arg, doc, now: all(truthy(v) for v in _args(arg, doc, now)),
    "$or": lambda arg, doc, now: any(truthy(v) for v in _args(arg, doc, now)),
    "$not": lambda arg, doc, now: not truthy(_args(arg, doc, now)[0]),
    "$eq": _compare(lambda c: c == 0),
    "$ne": _compare(lambda c: c != 0),
    "$lt": _compare(lambda c: c < 0),
    "$lte": _compare(lambda c: c <= 0),
    "$gt": _compare(lambda c: c > 0),
    "$gte": _compare(lambda c: c >= 0),
}


def matches(query: Mapping[str, Any], doc: Mapping[str, Any], now: datetime) -> bool:
    """Whether a find filter matches ``doc``."""
    for key, condition in query.items():
        if key == "$or":
            ok = any(matches(q, doc, now) for q in condition)
        elif key == "$and":
            ok = all(matches(q, doc, now) for q in condition)
        elif key == "$expr":
            ok = truthy(evaluate(condition, doc, now))
        else:
            ok = _field_matches(doc.get(key, MISSING), condition)
        if not ok:
            return False
    return True


def _field_matches(value: Any, condition: Any) -> bool:
    if not (isinstance(condition, dict) and condition and next(iter(condition)).startswith("$")):
        if condition is None:
            return value in (MISSING, None)
        return value is not MISSING and _order(value, condition) == 0
    return all(_FIELD_OPS[op](value, arg) for op, arg in condition.items())


_FIELD_OPS: dict[str, Any] = {
    "$type": lambda v, t: {"date": isinstance(v, datetime), "string": isinstance(v, str)}[t],
    "$in": lambda v, arg: any(_field_matches(v, a) for a in arg),
    "$nin": lambda v, arg: not any(_field_matches(v, a) for a in arg),
    "$ne": lambda v, arg: not _field_matches(v, arg),
    "$exists": lambda v, arg: (v is not MISSING) == arg,
    "$gte": lambda v, arg: v is not MISSING and _rank(v) == _rank(arg) and _order(v, arg) >= 0,
    "$lte": lambda v, arg: v is not MISSING and _rank(v) == _rank(arg) and _order(v, arg) <= 0,
}


def run(pipeline: list[dict[str, Any]], doc: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """An update pipeline of ``$set`` and ``$replaceWith`` stages applied to ``doc``."""
    out = dict(doc)
    for stage in pipeline:
        (op, fields), = stage.items()
        if op == "$replaceWith":
            out = evaluate(fields, out, now)
            continue
        assert op == "$set", op
        before = dict(out)
        for name, expr in fields.items():
            value = evaluate(expr, before, now)
            if value is MISSING:
                out.pop(name, None)
            else:
                out[name] = value
    return out
