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


def test_a_dead_workers_lapsed_lease_does_not_hold_its_key_at_zero_replicas(
        store: PostgresStore, pg_url: str) -> None:
    # Given a key limited to one job at a time: 5 jobs of it, one claimed by a worker that
    # died, its lease run out (no worker runs, so no sweep frees the slot)
    q = store.queue("thumbnails", key_limit=1)
    for i in range(5):
        q.enqueue(f"a{i}", {}, concurrency_key="a")
    assert len(q.claim("w", limit=1, lease_s=30)) == 1
    store.time_offset_s += 60
    # When KEDA runs the example's query, and the gauges are read
    with psycopg.connect(pg_url) as conn:
        (counted,) = conn.execute(example_query(store.options.schema).replace(
            "now()", f"(now() + interval '{store.time_offset_s} seconds')")).fetchone()
    (snap,) = snapshot(store, ["thumbnails"])
    # Then both see the key's work: a worker started for it sweeps at once, which frees the
    # slot (counted as running, the lapsed job held every job of its key back: 0 replicas,
    # and nothing ever to start the worker whose sweep would free it)
    assert (snap.ready, snap.in_flight) == (5, 0)
    assert snap.runnable == counted == 1
