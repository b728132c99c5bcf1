"""examples/keda/scaledobject-mongodb.yaml counts what the store counts (issue 11, 1 and 7):
ready jobs by the claim's own predicate, plus in-flight ones, with documents of the original
shape (no attempts / max_attempts) read as the store reads them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pipeline_model import matches

from leaseq.stores.mongodb import documents, indexes

EXAMPLE = Path(__file__).parents[2] / "examples" / "keda" / "scaledobject-mongodb.yaml"


def example_query() -> dict[str, Any]:
    """The folded ``query: >-`` block of the trigger, as JSON."""
    lines = EXAMPLE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "query: >-")
    indent = len(lines[start + 1]) - len(lines[start + 1].lstrip())
    block = [line for line in lines[start + 1:] if line.startswith(" " * indent)]
    return json.loads(" ".join(line.strip() for line in block))


def at_server_now(node: Any) -> Any:
    """The store's ``now(0)`` written as KEDA can send it: plain ``$$NOW``."""
    if node == documents.now(0):
        return "$$NOW"
    if isinstance(node, dict):
        return {k: at_server_now(v) for k, v in node.items()}
    if isinstance(node, list):
        return [at_server_now(v) for v in node]
    return node


def field_refs(node: Any, inside_ifnull: bool = False) -> list[tuple[str, bool]]:
    if isinstance(node, str) and node in ("$attempts", "$max_attempts"):
        return [(node, inside_ifnull)]
    if isinstance(node, dict):
        return [r for k, v in node.items() for r in field_refs(v, k == "$ifNull")]
    if isinstance(node, list):
        return [r for v in node for r in field_refs(v, inside_ifnull)]
    return []


def test_the_ready_branches_are_the_claims_own():
    fresh, due, _ = example_query()["$or"]
    store_fresh, store_due, _ = at_server_now(documents.claimable(0))["$or"]
    assert (fresh, due) == (store_fresh, store_due)


def test_processing_counts_while_its_lease_lives_or_once_it_is_claimable_again():
    *_, running = example_query()["$or"]
    *_, expired = at_server_now(documents.claimable(0))["$or"]
    live = at_server_now(documents.in_flight(0))
    assert running["status"] == expired["status"] == live["status"] == "processing"
    claimable = expired["$expr"]["$and"][1]["$or"]
    assert running["$expr"] == {"$or": [live["$expr"], *claimable]}


def test_attempts_are_read_with_their_defaults_everywhere():
    refs = field_refs(example_query())
    assert refs and all(inside for _, inside in refs)


def test_the_example_query_is_served_by_the_stores_index():
    jobs = [keys for keys, _ in indexes.job_indexes({})]
    assert indexes.unserved(example_query(), [], jobs) == []


def test_the_example_counts_ready_and_in_flight_jobs_of_any_shape():
    now = datetime(2024, 1, 2, tzinfo=UTC)
    later, earlier = now + timedelta(minutes=1), now - timedelta(minutes=1)
    docs = [
        {"status": "pending"},  # original shape: no attempts, no max_attempts
        {"status": "pending", "lease_until": earlier, "attempts": 2},
        {"status": "pending", "lease_until": later},  # backing off: not work yet
        {"status": "processing", "lease_until": later, "attempts": 5},  # running, last try
        {"status": "processing", "lease_until": earlier, "attempts": 5},  # spent: reclaim's
        {"status": "processing", "lease_until": earlier, "attempts": 5, "stale": True},
        {"status": "done"},
    ]
    counted = [matches(example_query(), {"_id": i, **d}, now) for i, d in enumerate(docs)]
    assert counted == [True, True, False, True, False, True, False]
    for i, doc in enumerate(docs):
        store_counts = (matches(documents.claimable(0), {"_id": i, **doc}, now)
                        or matches(documents.in_flight(0), {"_id": i, **doc}, now))
        assert counted[i] == store_counts
