"""PostgreSQL-specific: a batch reaches the server as JSON text, and the ``json`` columns keep
text as given, so what is stored must be the very text the spec carried. Replay detection
compares that stored text with the spec's ``payload_json``; a re-spelled payload (escapes,
spacing) would turn every replay into a conflict. The other stores keep no text to compare."""

from __future__ import annotations

import json

import psycopg
import pytest

from leaseq.job import JobSpec
from leaseq.stores.postgres import PostgresStore

PAYLOAD = {"é": "snow ☃ \u2028 😀", "a": {"b": [1, 2.5, None, {"c": "q\"uo'te \\ /"}]},
           "control": "\t\n\x01", "big": 2**63}


def _stored(store: PostgresStore, sql: str) -> list[tuple[str, str | None]]:
    sql = sql.format(schema=f'"{store.options.schema}"')
    return store._session.run(lambda conn: conn.execute(sql).fetchall())


def test_a_batch_stores_each_payload_as_its_canonical_text(store: PostgresStore) -> None:
    # Given a batch of new jobs with nested, non-ASCII payloads, some with a revision
    q = store.queue("texts")
    batch = [q.spec(f"j{i} ☃", {**PAYLOAD, "i": i}, revision="ré\"v" if i % 2 else None)
             for i in range(4)]
    # When it is enqueued in one call
    assert {r.outcome for r in q.enqueue_many(batch)} == {"created"}
    # Then each payload is stored byte for byte as the spec's canonical text
    jobs = dict(_stored(store, "SELECT id, payload::text FROM {schema}.jobs"))
    assert jobs == {s.job_id: s.payload_json for s in batch}
    # And the journal data of a revised job is the same text the careful path writes (a
    # creation without a revision writes no row: its record tells it)
    data = dict(_stored(store, "SELECT job_id, data::text FROM {schema}.journal"))
    assert data == {s.job_id: json.dumps({"revision": s.revision}) for s in batch
                    if s.revision}


def test_a_batch_keeps_each_jobs_own_values_shared_or_not(store: PostgresStore) -> None:
    # Given a batch where some columns vary from job to job (task, priority, key, delay,
    # revision, some of them NULL) and others are shared by all (max_attempts), so both forms
    # of batch_columns travel in one statement
    q = store.queue("mixed")
    batch = [q.spec(f"m{i}", {"i": i}, task=f"t{i % 2}" if i else None,
                    revision=f"r{i}" if i % 3 == 0 else None, delay_s=60.0 * (i % 2),
                    max_attempts=7, priority=i % 3, concurrency_key=f"k{i}" if i % 2 else None)
             for i in range(6)]
    # When it is enqueued in one call
    assert {r.outcome for r in q.enqueue_many(batch)} == {"created"}
    # Then every job holds its own values
    for spec in batch:
        job = q.get(spec.job_id)
        assert (job.task, job.revision, job.max_attempts, job.priority, job.concurrency_key) == (
            spec.task, spec.revision, spec.max_attempts, spec.priority, spec.concurrency_key)
    # And the delayed ones are not ready yet, the others are
    ready = {j.id for j in q.list_jobs(status="pending") if j.lease_until is not None
             and j.lease_until <= store.server_now()}
    assert ready == {s.job_id for s in batch if s.delay_s == 0}


def test_a_hand_built_spec_whose_payload_is_not_one_json_value_fails_the_whole_batch(
        store: PostgresStore) -> None:
    # Given batches each holding one hand-built spec (Queue.spec never makes one) whose
    # payload_json is two JSON values, or half of one, beside a good spec
    q = store.queue("broken")
    good = q.spec("good", {"a": 1})
    for broken in ('{"a":1},{"b":2}', '{"a":', '{"a":1}]'):
        # When the batch is enqueued
        with pytest.raises(psycopg.Error):
            q.enqueue_many([JobSpec("bad", {}, broken), good])
        # Then nothing is written: no job took a neighbour's payload
        assert q.counts() == {}
    # And a good batch still goes in
    assert [r.outcome for r in q.enqueue_many([good])] == ["created"]
