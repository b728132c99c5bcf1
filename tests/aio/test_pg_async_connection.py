"""Transactional ``aenqueue`` on the caller's own ``psycopg.AsyncConnection``: the job commits
or rolls back with the caller's transaction, and a conflict leaves it usable."""

from __future__ import annotations

import asyncio

import pytest

from leaseq import InvalidInput, JobConflict, Queue
from leaseq.stores import connect
from leaseq.stores.postgres.options import parse_url


def test_aenqueue_joins_the_callers_async_transaction(pg_store_url: str) -> None:
    import psycopg

    store = connect(pg_store_url)
    q = Queue(store, "mail")
    conninfo, _ = parse_url(pg_store_url)

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(conninfo) as aconn:
            # Given a rolled-back transaction: its job is gone with it
            with pytest.raises(RuntimeError):
                async with aconn.transaction():
                    await q.aenqueue("rolled", {}, connection=aconn)
                    raise RuntimeError("business write failed")
            # Given a committed one, with a conflict inside it
            async with aconn.transaction():
                await q.aenqueue("kept", {"n": 1}, connection=aconn)
                with pytest.raises(JobConflict):
                    await q.aenqueue("kept", {"n": 2}, connection=aconn)
                # Then the caller's transaction is still usable
                assert (await (await aconn.execute("SELECT 41 + 1")).fetchone()) == (42,)
                assert await q.aget("kept") is None  # not visible before the commit
            with pytest.raises(InvalidInput, match="autocommit"):
                await aconn.set_autocommit(True)
                await q.aenqueue("x", {}, connection=aconn)
            with pytest.raises(TypeError):
                await q.aenqueue("x", {}, connection=object())
        await store.aclose()

    try:
        asyncio.run(scenario())
        assert q.get("rolled") is None
        assert q.get("kept").payload == {"n": 1}  # type: ignore[union-attr]
    finally:
        store.close()


@pytest.mark.timeout(60)
def test_an_event_loop_that_ends_without_aclose_does_not_hang(pg_store_url: str) -> None:
    # Given loops that use the async API and end without aclose() (a short script's way)
    store = connect(pg_store_url)
    q = Queue(store, "mail")
    try:
        for n in range(5):
            asyncio.run(q.aenqueue(f"j{n}", {}))
            assert asyncio.run(q.aget(f"j{n}")) is not None
        # Then each asyncio.run returned (the async connections hold no task of their own)
        assert q.counts() == {"pending": 5}
    finally:
        store.close()


def test_a_worker_closes_the_connections_its_async_handlers_opened(pg_store_url: str) -> None:
    # Given an async task that enqueues from inside its handler, on the worker's event loop
    import leaseq
    from leaseq.worker import Worker, WorkerConfig

    app = leaseq.App(url=pg_store_url)
    loops: list[asyncio.AbstractEventLoop] = []  # keeps the loop, and its connections, alive

    @app.task(queue="parents")
    async def parent(n: int) -> None:
        loops.append(asyncio.get_running_loop())
        await child.aenqueue(n, job_id=f"child-{n}")

    @app.task(queue="children")
    def child(n: int) -> None:
        pass

    try:
        for n in range(3):
            parent.enqueue(n)
        # When a worker runs them and stops
        Worker(app, WorkerConfig(queues=("parents",), burst=True, idle_max_s=0.05)).run()
        # Then the children are there, and no connection is left open on the handlers' loop
        # (they were left to the garbage collector, with a ResourceWarning each)
        assert app.queue("children").counts() == {"pending": 3}
        assert loops and app.store._async._by_loop.get(loops[0]) is None  # type: ignore[attr-defined]
    finally:
        app.close_store()
