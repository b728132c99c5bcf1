"""The async enqueue (native psycopg on PostgreSQL) carries a job's priority and concurrency
key, as the blocking one does (docs/limits.md)."""

from __future__ import annotations

import asyncio

from leaseq.stores.postgres import PostgresStore


def test_aenqueue_writes_priority_and_key(store: PostgresStore) -> None:
    q = store.queue("exports", key_limit=1)

    async def given() -> None:
        await q.aenqueue("a", {}, priority=1, concurrency_key="tenant:1")
        await q.aenqueue_many([q.spec("b", {}, priority=7, concurrency_key="tenant:1"),
                               q.spec("c", {})])

    asyncio.run(given())
    jobs = {j.id: (j.priority, j.concurrency_key) for j in q.iter_jobs()}
    assert jobs == {"a": (1, "tenant:1"), "b": (7, "tenant:1"), "c": (0, None)}
    assert sorted(j.id for j in q.claim("w", limit=5)) == ["b", "c"]  # one of tenant:1
