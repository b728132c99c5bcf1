"""Reading what a statement did from ``EXPLAIN (ANALYZE, FORMAT JSON)``: the rows its scans
read. A query that grows with the table shows it here whatever the plan's shape or index."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg

#: Nodes that read a table or an index (a CTE's or a work table's rows were counted once).
_TABLE_SCANS = ("Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Tid Scan")


def analyze(conn: psycopg.Connection, query: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Run ``query`` under EXPLAIN ANALYZE; its top plan node (inside a rolled-back
    savepoint, so a statement that writes leaves nothing behind)."""
    with conn.transaction(force_rollback=True):
        (row,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, params).fetchall()
    doc = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return doc[0]["Plan"]


def rows_read(plan: Mapping[str, Any]) -> int:
    """Rows every table and index scan of ``plan`` produced or threw away, over all loops
    (EXPLAIN reports both per loop)."""
    total = 0.0
    for node in _nodes(plan):
        if node["Node Type"] in _TABLE_SCANS:
            per_loop = (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
                        + node.get("Rows Removed by Index Recheck", 0))
            total += per_loop * node["Actual Loops"]
    return round(total)


def scans(plan: Mapping[str, Any]) -> list[str]:
    """``"Index Scan using jobs_outbox"``-style names of the scans in ``plan``."""
    return [f"{n['Node Type']} using {n['Index Name']}" if "Index Name" in n else n["Node Type"]
            for n in _nodes(plan) if n["Node Type"] in _TABLE_SCANS]


def _nodes(plan: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)
