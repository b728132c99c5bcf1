"""PostgreSQL-specific: a job's creation is told by its record. An enqueue writes a journal row
for it only when it carries data (a revision); the story's read puts the creation first from
the record's ``created_at``, and a deleted job's creation is written before its record goes.
The conformance suite checks the stories themselves; these tests check what is stored."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from leaseq.browse import BulkAction
from leaseq.job import JournalEntry
from leaseq.stores.postgres import PostgresStore


def _creation_rows(store: PostgresStore, job_id: str) -> int:
    sql = (f'SELECT count(*) FROM "{store.options.schema}".journal '
           "WHERE job_id = %s AND event = 'enqueued' AND reason = 'created'")
    return store._session.run(lambda conn: conn.execute(sql, [job_id]).fetchone()[0])


def _created_at(store: PostgresStore, job_id: str) -> object:
    sql = f'SELECT created_at FROM "{store.options.schema}".jobs WHERE id = %s'
    return store._session.run(lambda conn: conn.execute(sql, [job_id]).fetchone()[0])


def _first(entries: list[JournalEntry]) -> tuple[str, str | None]:
    return entries[0].event, entries[0].reason


@pytest.mark.parametrize("path", ["one", "batch", "careful", "transaction"])
def test_a_bare_creation_writes_no_row_and_the_story_still_starts_with_it(
        store: PostgresStore, path: str) -> None:
    # Given new jobs enqueued through each path that creates them: the one-job statement, the
    # batch statement, the careful path (an id twice in one batch) and a caller's transaction
    q = store.queue("births")
    if path == "one":
        q.enqueue("a", {"n": 1})
    elif path == "batch":
        q.enqueue_many([q.spec("a", {"n": 1}), q.spec("b", {"n": 2})])
    elif path == "careful":
        q.enqueue_many([q.spec("a", {"n": 1}), q.spec("a", {"n": 1})])
    else:
        with psycopg.connect(store._conninfo) as conn, conn.transaction():
            q.enqueue("a", {"n": 1}, connection=conn)
    # Then no creation row was written
    assert _creation_rows(store, "a") == 0
    # And the story still starts with the creation, stamped with the record's creation time
    story = q.journal("a")
    assert _first(story) == ("enqueued", "created")
    assert story[0].at == _created_at(store, "a")
    assert [e.event for e in story] == ["enqueued"]


def test_a_creation_with_a_revision_is_written_once_with_its_data(store: PostgresStore) -> None:
    q = store.queue("births")
    q.enqueue("one", {"n": 1}, revision="r1")
    q.enqueue_many([q.spec("two", {"n": 2}, revision="r2"), q.spec("three", {"n": 3})])
    assert (_creation_rows(store, "one"), _creation_rows(store, "two")) == (1, 1)
    assert _creation_rows(store, "three") == 0
    for job_id, revision in (("one", "r1"), ("two", "r2")):
        story = q.journal(job_id)
        assert [(e.event, e.reason, e.data) for e in story] == [
            ("enqueued", "created", {"revision": revision})]


def test_a_careful_enqueue_of_new_ids_still_wakes_the_listeners(store: PostgresStore) -> None:
    # Given a listener on the store's channel
    with psycopg.connect(store._conninfo, autocommit=True) as listener:
        listener.execute(f'LISTEN "{store.options.channel}"')
        # When new ids go through the careful path, which now writes no journal row for them
        q = store.queue("births")
        q.enqueue_many([q.spec("a", {"n": 1}), q.spec("a", {"n": 1})])
        # Then the NOTIFY was still sent with the insert
        notes = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.payload for n in notes] == ["births"]


def test_an_update_keeps_the_creation_first_then_the_update(store: PostgresStore) -> None:
    q = store.queue("births")
    q.enqueue("a", {"n": 1})
    q.enqueue("a", {"n": 2}, revision="r2", on_conflict="replace")
    assert [(e.event, e.reason) for e in q.journal("a")] == [
        ("enqueued", "created"), ("enqueued", "updated")]


def test_a_deleted_job_keeps_its_creation_in_the_story(store: PostgresStore) -> None:
    # Given a job created without a journal row, claimed and finished
    q = store.queue("births")
    q.enqueue("a", {"n": 1})
    q.enqueue("b", {"n": 2}, revision="r")  # its creation row exists already
    for job in q.claim("w1", limit=2):
        q.complete(job.lease)
    born = _created_at(store, "a")
    before = [(e.event, e.reason) for e in q.journal("a")]
    # When an operator deletes both
    result = store.act_on_jobs("births", BulkAction.DELETE, ["a", "b"], "ops")
    assert sorted(result.acted) == ["a", "b"]
    # Then the records are gone and each story is whole: the creation (written now for "a",
    # at its old time, still first), everything after it, then the deletion
    assert q.get("a") is None and q.get("b") is None
    story = q.journal("a")
    assert [(e.event, e.reason) for e in story][:-1] == before
    assert (story[0].at, story[-1].event) == (born, "deleted")
    assert (_creation_rows(store, "a"), _creation_rows(store, "b")) == (1, 1)
    assert q.journal("b")[0].event == "enqueued"


def test_the_async_one_job_enqueue_writes_the_same_rows(store: PostgresStore) -> None:
    q = store.queue("births")

    async def enqueue() -> list[str]:
        first = await q.aenqueue("bare", {"n": 1})
        second = await q.aenqueue("revised", {"n": 2}, revision="r")
        replay = await q.aenqueue("bare", {"n": 1})
        return [first.outcome, second.outcome, replay.outcome]

    assert asyncio.run(enqueue()) == ["created", "created", "unchanged"]
    assert (_creation_rows(store, "bare"), _creation_rows(store, "revised")) == (0, 1)
    assert [(e.event, e.reason) for e in q.journal("bare")] == [("enqueued", "created")]
    assert q.journal("revised")[0].data == {"revision": "r"}
