"""The MongoDB store's async API against the recording fake: the reads on pymongo's async
client (one per event loop), the writes on the store's worker thread, errors masked."""

from __future__ import annotations

import asyncio
import json

import pymongo
import pytest
from mongo_fakes import FakeAsyncDB, FakeDB
from pymongo.errors import ExecutionTimeout, OperationFailure, ServerSelectionTimeoutError

from leaseq.deadline import within
from leaseq.errors import StoreRefused, StoreUnavailable
from leaseq.job import JobSpec
from leaseq.queue import Queue
from leaseq.stores.mongodb import MongoStore
from leaseq.stores.mongodb.connection import async_opener, parse_url
from leaseq.stores.watch import FinishWatch

Q = "leaseq_mail"


def store_with_async(db: FakeDB) -> tuple[MongoStore, FakeAsyncDB]:
    fake = FakeAsyncDB(db)
    return MongoStore(db, url="mongodb://u:pw@h/db", async_database=fake.opener()), fake


def test_async_reads_use_the_async_client_once_per_event_loop(db: FakeDB) -> None:
    store, fake = store_with_async(db)
    done = {"_id": "j1", "status": "done", "attempts": 1, "max_attempts": 5,
            "lease_epoch": 1, "result": {"n": 1}}
    # aget; then await_result's reads: running, then (after one poll) finished
    db[Q].answer("find_one", done, {**done, "status": "processing"}, done)
    db[Q].answer("aggregate", [{"_id": "done", "n": 1}])
    db["leaseq_journal"].answer("find", [{"job_id": "j1", "event": "result_saved"}])
    q = Queue(store, "mail")

    async def scenario() -> tuple[object, ...]:
        job = await q.aget("j1")
        counts = await q.acounts()
        events = [e.event for e in await q.ajournal("j1")]
        finished = await q.await_result("j1", timeout_s=30)  # one 0.1 s poll: never that long
        await store.aclose()
        await store.aclose()  # nothing left to close on this loop
        return job.result, counts, events, finished.status  # type: ignore[union-attr]

    assert asyncio.run(scenario()) == ({"n": 1}, {"done": 1}, ["result_saved"], "done")
    assert (fake.opened, fake.closed) == (1, 1)
    asyncio.run(store.aget("mail", "nope"))  # another loop: another client
    assert fake.opened == 2


def test_async_writes_run_the_blocking_code_on_the_worker_thread(db: FakeDB) -> None:
    store, _ = store_with_async(db)
    db[Q].answer("find_one_and_update", None,  # the enqueue's upsert: a new job
                 {"_id": "j1", "status": "cancelled", "attempts": 0, "max_attempts": 5,
                  "lease_epoch": 0})
    spec = JobSpec("n", {"a": 1}, json.dumps({"a": 1}, separators=(",", ":")))

    async def scenario() -> tuple[object, ...]:
        created = await store.aenqueue_many("mail", [spec])
        return created[0].outcome.value, await store.acancel("mail", "j1")

    assert asyncio.run(scenario()) == ("created", True)


def test_a_store_without_an_async_client_reads_on_its_worker_thread(db: FakeDB) -> None:
    store = MongoStore(db, url="mongodb://h/db")
    db[Q].answer("aggregate", [{"_id": "pending", "n": 3}])

    async def scenario() -> tuple[object, ...]:
        counts = await store.acounts("mail")
        got = await store.aget("mail", "nope")
        events = await store.ajournal("mail", "nope")
        await store.aclose()
        return counts, got, events

    assert asyncio.run(scenario()) == ({"pending": 3}, None, [])
    assert isinstance(store.watch_finish("mail", "j1"), FinishWatch)  # MongoDB polls


def test_async_connection_errors_are_masked(db: FakeDB) -> None:
    store, _ = store_with_async(db)
    db[Q].answer("find_one", ServerSelectionTimeoutError("no server at u:pw@h"))
    with pytest.raises(StoreUnavailable) as caught:
        asyncio.run(store.aget("mail", "j1"))
    assert "pw" not in str(caught.value) and "unavailable" in str(caught.value)


def test_async_reads_run_within_the_callers_deadline(db: FakeDB) -> None:
    # Given a caller's deadline around an async read, and a server that runs out of time
    store, _ = store_with_async(db)
    seen: list[float | None] = []
    find_one = db[Q].find_one

    def noting_the_timeout(*args: object, **kwargs: object) -> object:
        seen.append(pymongo._csot.get_timeout())
        return find_one(*args, **kwargs)

    db[Q].find_one = noting_the_timeout  # type: ignore[method-assign]
    db[Q].answer("find_one", None, ExecutionTimeout("operation exceeded time limit", 50))

    async def scenario() -> None:
        with within(2.0):
            await store.aget("mail", "j1")
            # Then the read ran under pymongo's timeout set to what was left of it
            assert seen and seen[0] is not None and 0 < seen[0] <= 2.0
            # and a server-side timeout is StoreUnavailable, not pymongo's own error
            with pytest.raises(StoreUnavailable, match="unavailable"):
                await store.aget("mail", "j1")

    asyncio.run(scenario())


def test_an_async_read_the_server_refuses_raises_its_error(db: FakeDB) -> None:
    # Not a connection problem nor a timeout: the caller sees the server's own error
    store, _ = store_with_async(db)
    db[Q].answer("find_one", OperationFailure("bad value", code=2))
    with pytest.raises(OperationFailure, match="bad value"):
        asyncio.run(store.aget("mail", "j1"))


@pytest.mark.parametrize("code", [13, 18], ids=["unauthorized", "authentication"])
def test_an_async_read_by_a_user_the_server_refuses_is_store_refused(db: FakeDB,
                                                                     code: int) -> None:
    # Given a server that refuses the URL's user (a role granted too little, a wrong password)
    store, _ = store_with_async(db)
    db[Q].answer("find_one", OperationFailure("not authorized on db as u:pw", code=code))
    # When an async read meets it, Then it is StoreRefused, as the blocking read's, masked
    with pytest.raises(StoreRefused, match="refused leaseq's call") as caught:
        asyncio.run(store.aget("mail", "j1"))
    assert "pw" not in str(caught.value)


def test_the_url_opener_makes_a_lazy_async_client() -> None:
    database, close = async_opener(parse_url("mongodb://h:1/jobs?serverSelectionTimeoutMS=50"))()
    assert database.name == "jobs"
    asyncio.run(close())
