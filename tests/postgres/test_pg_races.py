"""PostgreSQL-specific: concurrent enqueues of the same new ids. (Store-specific because the
race is in this store's own mechanism: the one-statement enqueue fails on the unique index
when another enqueue inserted one of its ids first, and the careful path — INSERT … ON
CONFLICT DO NOTHING, then decide again under the winner's row lock, under a savepoint —
decides the whole batch again.)"""

from __future__ import annotations

import threading
from collections import Counter

import psycopg
import pytest
from pg_locks import until_blocked_by

from leaseq.errors import JobConflict
from leaseq.stores.postgres import PostgresStore

THREADS = 8
IDS = 200


def test_racing_enqueues_of_the_same_ids_create_each_job_once(store: PostgresStore) -> None:
    # Given eight producers that enqueue the same 200 new ids at the same moment, each in
    # its own order (so their row locks interleave)
    q = store.queue("race")
    start = threading.Barrier(THREADS)
    outcomes: Counter[str] = Counter()
    errors: list[BaseException] = []
    lock = threading.Lock()

    def produce(n: int) -> None:
        ids = [f"job-{(i * (n + 1)) % IDS:04d}" for i in range(IDS)]
        specs = [q.spec(job_id, {"same": True}) for job_id in dict.fromkeys(ids)]
        start.wait()
        try:
            results = q.enqueue_many(specs)
        except BaseException as exc:
            errors.append(exc)
            return
        with lock:
            outcomes.update(r.outcome.value for r in results)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    # Then nobody failed, every id was created exactly once and replayed by the others
    assert errors == []
    assert outcomes["created"] == IDS
    assert set(outcomes) <= {"created", "unchanged"}
    assert q.counts() == {"pending": IDS}
    assert all(len(q.journal(f"job-{i:04d}")) == 1 for i in range(0, IDS, 17))


def _blocked_enqueue(store: PostgresStore, pg_url: str,
                     payload: dict[str, int]) -> dict[str, object]:
    """Enqueue ["a", "b"] while another transaction holds an uncommitted insert of "b"
    (``payload``); commit that insert once the enqueue waits on it."""
    q = store.queue("race")
    payload = q.spec("b", payload).payload_json
    schema = store.options.schema
    box: dict[str, object] = {}
    with psycopg.connect(pg_url) as other:
        other.execute(f'INSERT INTO "{schema}".jobs (queue, id, status, payload, max_attempts, '
                      "lease_until, created_at, updated_at, first_seen_at) VALUES ('race', 'b', "
                      "'pending', %s, 5, now(), now(), now(), now())", [payload])

        def enqueue() -> None:
            try:
                box["results"] = q.enqueue_many([q.spec("a", {"v": 1}), q.spec("b", {"v": 1})])
            except BaseException as exc:
                box["error"] = exc

        thread = threading.Thread(target=enqueue)
        thread.start()
        until_blocked_by(pg_url, other.info.backend_pid)
        other.commit()
        thread.join(30)
    return box


def test_an_insert_race_lost_to_the_same_payload_is_a_replay(
        store: PostgresStore, pg_url: str) -> None:
    # Given an enqueue of a and b that runs into another producer's uncommitted b
    # When that producer commits b with the same payload
    box = _blocked_enqueue(store, pg_url, {"v": 1})
    # Then a is created and b is a replay of the winner's job
    assert "error" not in box
    assert [(r.job_id, r.outcome.value) for r in box["results"]] == [  # type: ignore[attr-defined]
        ("a", "created"), ("b", "unchanged")]
    q = store.queue("race")
    assert q.counts() == {"pending": 2}
    assert [e.event for e in q.journal("a")] == ["enqueued"]


def test_an_insert_race_lost_to_another_payload_raises_and_writes_nothing(
        store: PostgresStore, pg_url: str) -> None:
    # Given an enqueue of a and b that runs into another producer's uncommitted b
    # When that producer commits b with another payload
    box = _blocked_enqueue(store, pg_url, {"v": 2})
    # Then the enqueue raises the conflict, and a was not written either
    assert isinstance(box.get("error"), JobConflict)
    q = store.queue("race")
    assert q.get("a") is None and q.journal("a") == []
    assert q.get("b").payload == {"v": 2}


# --- the key-limited claim against a job that changed after its snapshot ------------------

#: A pause the test holds the key-limited claim in: after the statement's snapshot (taken
#: when it starts) and before it locks the jobs it chose.
_PAUSE = 4242


def _paused_keyed_claim(store: PostgresStore) -> None:
    """Make ``store``'s key-limited claim wait on advisory lock ``_PAUSE`` once it has chosen
    its jobs from its snapshot, before it locks them."""
    query = store.queries["claim_keyed"]
    chosen = "best AS (\n    SELECT id FROM cand "
    assert chosen in query
    store.queries["claim_keyed"] = query.replace(
        chosen, f"pause AS MATERIALIZED (SELECT pg_advisory_xact_lock({_PAUSE})),\n"
                f"{chosen}CROSS JOIN pause ")


def _cancel(q: object, job_id: str) -> None:
    assert q.cancel(job_id)  # type: ignore[attr-defined]


def _finish_late(q: object, job_id: str) -> None:
    """The job's old holder, whose lease ran out, finishes it after all (its epoch is still
    the job's: nobody has claimed it since)."""
    job = q.get(job_id)  # type: ignore[attr-defined]
    q.complete(job.lease, {"late": True})  # type: ignore[attr-defined]


@pytest.mark.parametrize("change", [_cancel, _finish_late], ids=["cancelled", "finished"])
def test_a_key_limited_claim_never_takes_a_job_that_left_the_ready_set_after_its_snapshot(
        store: PostgresStore, pg_url: str, change: object) -> None:
    # Given a key-limited queue whose one job is ready: pending, or processing under a lease
    # that ran out (its holder may still finish it; it counts as one of its key's two running
    # jobs, so its key has a slot for it)
    q = store.queue("keyed", key_limit=2)
    q.enqueue("a", {"n": 1}, concurrency_key="k")
    if change is _finish_late:
        q.claim("old-worker", lease_s=60)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'UPDATE "{store.options.schema}".jobs '
                         "SET lease_until = now() - interval '1 second' WHERE id = 'a'")
    # And a claim that has chosen it from its snapshot, held before it locks it
    _paused_keyed_claim(store)
    box: dict[str, object] = {}
    with psycopg.connect(pg_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [_PAUSE])
        thread = threading.Thread(target=lambda: box.update(jobs=q.claim("new-worker", 5)))
        thread.start()
        until_blocked_by(pg_url, holder.info.backend_pid)
        # When the job leaves the ready set meanwhile (cancelled; finished by its old holder)
        other = PostgresStore.from_url(store.url)
        try:
            change(other.queue("keyed", key_limit=2), "a")  # type: ignore[operator]
        finally:
            other.close()
        holder.execute("SELECT pg_advisory_unlock(%s)", [_PAUSE])
        thread.join(30)
    # Then the claim takes nothing, and the job keeps what the change wrote
    assert box["jobs"] == []
    assert q.get("a").status == ("cancelled" if change is _cancel else "done")
