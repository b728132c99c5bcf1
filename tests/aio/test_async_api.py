"""The ``a``-prefixed API on every store the machine has (MongoDB's in tests/mongodb): the
same outcomes as the blocking methods, on the store's native async driver where it has one."""

from __future__ import annotations

import asyncio

import pytest

from leaseq import App, JobConflict, JobNotFound, Queue
from leaseq.stores.base import Store


def test_aenqueue_then_aget_acounts_ajournal(store: Store) -> None:
    q = Queue(store, "mail")

    async def scenario() -> None:
        # Given a job enqueued through the async API
        first = await q.aenqueue("j1", {"to": "a@example.com"})
        again = await q.aenqueue("j1", {"to": "a@example.com"})
        # Then it is created once, replayed idempotently, and readable asynchronously
        assert (first.outcome.value, again.outcome.value) == ("created", "unchanged")
        job = await q.aget("j1")
        assert job is not None and job.status == "pending"
        assert job.payload == {"to": "a@example.com"}
        assert await q.acounts() == {"pending": 1}
        assert [e.event for e in await q.ajournal("j1")] == ["enqueued"]
        await store.aclose()

    asyncio.run(scenario())
    assert q.get("j1") is not None  # the blocking API sees the same record


def test_aenqueue_many_conflict_rolls_back_the_whole_batch(store: Store) -> None:
    q = Queue(store, "mail")

    async def scenario() -> None:
        await q.aenqueue("j1", {"n": 1})
        # When a batch holds a new job and a conflicting one
        with pytest.raises(JobConflict):
            await q.aenqueue_many([{"job_id": "j2", "payload": {"n": 2}},
                                   {"job_id": "j1", "payload": {"n": 9}}])
        # Then nothing of it was written; a replacing enqueue updates instead
        assert await q.aget("j2") is None
        result = await q.aenqueue("j1", {"n": 9}, on_conflict="replace")
        assert result.outcome.value == "updated"
        await store.aclose()

    asyncio.run(scenario())


def test_acancel_arequeue_and_missing_jobs(store: Store) -> None:
    q = Queue(store, "mail")

    async def scenario() -> None:
        await q.aenqueue("j1", {})
        assert await q.acancel("j1") is True
        assert (await q.aget("j1")).status == "cancelled"  # type: ignore[union-attr]
        assert await q.arequeue("j1") is True
        assert (await q.aget("j1")).status == "pending"  # type: ignore[union-attr]
        assert await q.arequeue("j1") is False  # live: nothing to re-drive
        with pytest.raises(JobNotFound):
            await q.acancel("nope")
        await store.aclose()

    asyncio.run(scenario())


def test_task_and_app_aenqueue(store_url: str) -> None:
    app = App(url=store_url)

    @app.task(queue="mail")
    def send(to: str, retries: int = 0) -> None: ...

    async def scenario() -> None:
        # Given no store opened yet (the first use opens it off the event loop)
        assert not app.has_open_store()
        by_task = await send.aenqueue("a@example.com", job_id="t1")
        by_app = await app.aenqueue("send", {"to": "b@example.com"}, job_id="t2")
        assert [by_task.outcome.value, by_app.outcome.value] == ["created", "created"]
        job = await app.queue("mail").aget("t2")
        assert job is not None and job.task == "send"
        await app.store.aclose()

    try:
        asyncio.run(scenario())
    finally:
        app.store.close()
