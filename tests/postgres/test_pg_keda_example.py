"""The PostgreSQL KEDA example (examples/keda/scaledobject-postgresql.yaml) counts what the
store's own gauges count: ready jobs within each key's free slots, plus in-flight jobs — so a
key limit's held-back jobs never start a worker."""

from __future__ import annotations

from pathlib import Path

import psycopg

from leaseq.metrics import snapshot
from leaseq.stores.postgres import PostgresStore

EXAMPLE = Path(__file__).parents[2] / "examples" / "keda" / "scaledobject-postgresql.yaml"


def example_query(schema: str) -> str:
    """The folded ``query: >-`` block of the trigger, on the test's schema."""
    lines = EXAMPLE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "query: >-")
    indent = len(lines[start + 1]) - len(lines[start + 1].lstrip())
    block = [line for line in lines[start + 1:] if line.startswith(" " * indent)]
    return " ".join(line.strip() for line in block).replace("leaseq.", f'"{schema}".')


def test_the_example_counts_runnable_and_in_flight_jobs(store: PostgresStore,
                                                         pg_url: str) -> None:
    # Given a key-limited queue: 7 jobs of key a, 3 of key b, 4 without a key, 3 claimed
    q = store.queue("thumbnails", key_limit=2)
    for i in range(7):
        q.enqueue(f"a{i}", {}, concurrency_key="a")
    for i in range(3):
        q.enqueue(f"b{i}", {}, concurrency_key="b")
    for i in range(4):
        q.enqueue(f"u{i}", {})
    assert len(q.claim("w", limit=3)) == 3
    # When KEDA runs the example's query
    with psycopg.connect(pg_url) as conn:
        (counted,) = conn.execute(example_query(store.options.schema)).fetchone()
    # Then it is ready − held back by key + in flight, as the gauges say
    (snap,) = snapshot(store, ["thumbnails"])
    assert snap.held_back.by_key > 0
    assert counted == snap.ready - snap.held_back.by_key + snap.in_flight == 8
