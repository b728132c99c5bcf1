"""The async primitives (``aenqueue_many``, ``aget``, ``acounts``, ``ajournal``,
``arequeue``, ``acancel``) answer exactly as their blocking twins, and ``watch_finish`` lets
a waiter see a finish another connection made (``Queue.wait`` / ``await_result``)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from leaseq.errors import JobConflict, JobNotFound
from leaseq.testing.harness import FreshStore, events, given_claimed, must_get

#: How long a waiter may take to see a finish: well above every store's wake-up path
#: (NOTIFY, SQLite's counter, a 100 ms poll), well below a lost wake-up's timeout.
SEEN_WITHIN_S = 5.0


def _run(leaseq_store: FreshStore, scenario: Any) -> Any:
    async def main() -> Any:
        try:
            return await scenario
        finally:
            await leaseq_store.store.aclose()
    return asyncio.run(main())


class AsyncApiSuite:
    def test_aenqueue_then_the_async_reads(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue("mail")

        async def scenario() -> tuple[Any, ...]:
            first = await q.aenqueue("j1", {"to": "a"})
            again = await q.aenqueue("j1", {"to": "a"})
            job = await q.aget("j1")
            assert job is not None
            return (first.outcome.value, again.outcome.value, job.payload,
                    await q.acounts(), events(await q.ajournal("j1")), await q.aget("nope"))

        assert _run(leaseq_store, scenario()) == (
            "created", "unchanged", {"to": "a"}, {"pending": 1}, ["enqueued"], None)

    def test_aenqueue_many_conflict_writes_nothing(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue("mail")
        q.enqueue("j1", {"n": 1})

        async def scenario() -> None:
            with pytest.raises(JobConflict):
                await q.aenqueue_many([{"job_id": "j2", "payload": {}},
                                       {"job_id": "j1", "payload": {"n": 2}}])

        _run(leaseq_store, scenario())
        assert q.get("j2") is None and must_get(q, "j1").payload == {"n": 1}

    def test_acancel_and_arequeue(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue("mail")
        q.enqueue("j1", {})

        async def scenario() -> tuple[Any, ...]:
            cancelled = await q.acancel("j1")
            requeued = await q.arequeue("j1")
            again = await q.arequeue("j1")
            with pytest.raises(JobNotFound):
                await q.acancel("nope")
            return cancelled, requeued, again

        assert _run(leaseq_store, scenario()) == (True, True, False)
        assert must_get(q, "j1").status == "pending"

    def test_a_waiter_sees_a_finish_made_by_another_connection(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a claimed job and a waiter on it
        q = leaseq_store.queue("mail")
        job = given_claimed(q)
        other = leaseq_store.open()
        finished_at: list[float] = []

        def finish() -> None:
            time.sleep(0.2)
            other.queue("mail").complete(job, {"ok": True})
            finished_at.append(time.monotonic())

        finisher = threading.Thread(target=finish)
        finisher.start()
        try:
            # When another connection completes it  Then the waiter returns it, soon after
            done = q.wait("j1", timeout_s=30)
            seen_at = time.monotonic()
        finally:
            finisher.join()
            other.close()
        assert done.status == "done" and done.result == {"ok": True}
        assert seen_at - finished_at[0] < SEEN_WITHIN_S
