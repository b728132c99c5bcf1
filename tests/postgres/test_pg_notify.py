"""PostgreSQL-specific: LISTEN/NOTIFY wake-ups reach an idle worker in another process at
once, not at its next poll. (Only PostgreSQL pushes wake-ups across processes.)"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from leaseq.job import Completion, Lease
from leaseq.stores.postgres import PostgresStore
from leaseq.stores.postgres.listen import Listener
from leaseq.stores.watch import FinishWaiters, finish_key

#: The idle worker's fallback poll: a wake-up that needs it would take this long.
POLL_S = 10.0


@pytest.fixture
def waiter(schema_url: str):  # type: ignore[no-untyped-def]
    """A second store on the same schema: as far as it can tell, another process."""
    other = PostgresStore.from_url(schema_url)
    yield other
    other.close()


def _wait_in_thread(store: PostgresStore, queues: list[str], timeout_s: float) -> dict:
    box: dict = {}

    def run() -> None:
        box["woken"] = store.wait_for_work(queues, timeout_s)
        box["at"] = time.monotonic()

    box["thread"] = threading.Thread(target=run, daemon=True)
    box["thread"].start()
    return box


def test_notify_wakes_an_idle_waiter_at_once(store: PostgresStore, waiter: PostgresStore) -> None:
    # Given a worker idle on "mail", its LISTEN connection in place
    assert waiter.wait_for_work(["mail"], 0.01) is False
    box = _wait_in_thread(waiter, ["mail"], POLL_S)
    # When another process enqueues a job
    sent = time.monotonic()
    store.queue("mail").enqueue("j1", {})
    box["thread"].join(POLL_S + 5)
    # Then the waiter woke long before its poll (in milliseconds; the bound leaves a busy
    # machine its scheduling and still tells a wake-up from the poll)
    latency = box["at"] - sent
    assert box["woken"] is True
    assert latency < POLL_S / 2, f"wake-up took {latency:.3f} s"
    # And a claim finds the job
    assert [j.id for j in waiter.queue("mail").claim("w1")] == ["j1"]


def test_notify_for_another_queue_does_not_wake(store: PostgresStore,
                                                waiter: PostgresStore) -> None:
    # Given a worker idle on "mail" only
    assert waiter.wait_for_work(["mail"], 0.01) is False
    # When a job is enqueued on another queue
    store.queue("billing").enqueue("j1", {})
    # Then the waiter is not woken
    assert waiter.wait_for_work(["mail"], 0.5) is False


def test_one_notify_per_queue_per_transaction(store: PostgresStore, schema_url: str,
                                              pg_url: str) -> None:
    import psycopg

    # Given a listener on the store's channel
    with psycopg.connect(pg_url, autocommit=True) as listen:
        listen.execute(f'LISTEN "{store.options.channel}"')
        # When a batch of 50 jobs in two queues is enqueued in one transaction
        with psycopg.connect(pg_url) as conn:
            store.queue("a").enqueue_many([{"job_id": f"a{i}", "payload": {}}
                                           for i in range(25)], connection=conn)
            store.queue("b").enqueue_many([{"job_id": f"b{i}", "payload": {}}
                                           for i in range(25)], connection=conn)
            store.queue("a").enqueue("a-late", {}, connection=conn)
        # Then one notification per queue arrives, and no more
        got = sorted(n.payload for n in listen.notifies(timeout=10, stop_after=2))
        more = [n.payload for n in listen.notifies(timeout=0.5)]
    assert got == ["a", "b"] and more == []


def test_one_finishing_statement_sends_every_key_in_few_notifications(
        store: PostgresStore, schema_url: str) -> None:
    # Given a connection listening to the finish channel and 450 claimed jobs
    channel = f"lqdone_{store.options.schema}"
    q = store.queue("mail")
    q.enqueue_many([q.spec(f"j{i}", {"i": i}) for i in range(450)])
    jobs = q.claim("w1", limit=450)
    with psycopg.connect(schema_url.split("?")[0], autocommit=True) as listener:
        listener.execute(f"LISTEN {channel}")
        # When one statement finishes all of them
        store.complete_many("mail", [Completion(Lease(j.id, j.lease_epoch)) for j in jobs])
        notes = list(listener.notifies(timeout=5, stop_after=3))
    # Then three notifications carry the 450 keys, each well under NOTIFY's 8,000 bytes
    keys = [key for note in notes for key in note.payload.split()]
    assert sorted(keys) == sorted(finish_key("mail", j.id) for j in jobs)
    assert len(notes) == 3 and max(len(n.payload) for n in notes) < 8000


def test_a_waiter_is_woken_by_a_key_in_a_shared_notification() -> None:
    # Given two waiters on different jobs
    waiters = FinishWaiters()
    woken: list[str] = []
    waiters.add(finish_key("q", "a"), lambda: woken.append("a"))
    waiters.add(finish_key("q", "b"), lambda: woken.append("b"))
    # When one notification names b among others, Then only b's waiter wakes
    waiters.heard(f"{finish_key('q', 'x')} {finish_key('q', 'b')} {finish_key('q', 'y')}")
    assert woken == ["b"]


def test_nobody_waits_for_a_listen_connection_that_cannot_be_made() -> None:
    # Given a listener whose LISTEN connection is refused (no server on that port; a
    # transaction pooler that cannot LISTEN fails the same way), while queries still work
    listener = Listener("postgresql://127.0.0.1:1/test?connect_timeout=5", "leaseq_x",
                        threading.Event(), finish_channel="leaseq_x_finish")
    answers: list[bool] = []

    def ask() -> None:
        answers.append(listener.listen_finishes(ready_timeout_s=60))
        answers.append(listener.watch(["q"], ready_timeout_s=60))

    # When a caller waits for the finish channel's LISTEN, then for the queues' one
    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    asker.join(10)
    listener.close()
    # Then both answer "not listening" once the connect failed, not after their minute (each
    # `await_result` and `wait` had waited its 2 s before reading the job, whatever its
    # timeout)
    assert not asker.is_alive()
    assert answers == [False, False]
