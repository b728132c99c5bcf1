"""The shared read layer of the SQL stores: SQLite and PostgreSQL inherit every inspection
method from ``SQLStore``, and a row as either database hands it back maps to the same record.
(What the reads return is the conformance suite's to check, on both databases.)"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from leaseq.job import Job, JournalEntry
from leaseq.stores.postgres.store import PostgresStore
from leaseq.stores.sqlbase import SQLStore
from leaseq.stores.sqlite.store import SQLiteStore

READS = ("server_now", "queues", "get", "list_jobs", "counts", "ready_stats", "in_flight",
         "journal", "outbox_due")
AT = datetime(2026, 3, 1, 12, 30, 15, 250_000, tzinfo=UTC)
# PostgreSQL hands timestamptz back in the session's time zone, not necessarily UTC.
AT_ELSEWHERE = AT.astimezone(timezone(timedelta(hours=5, minutes=30)))
PAYLOAD = {"order": 7, "items": ["a", "b"], "note": None}
RESULT = {"ok": True}


def job_row(time: object, payload: object, result: object, stale: object) -> dict[str, object]:
    return {
        "id": "j1", "queue": "q", "status": "processing", "payload": payload, "task": "ship",
        "attempts": 2, "max_attempts": 5, "snoozes": 1, "givebacks": 0, "lease_until": time,
        "lease_epoch": 3, "worker_id": "w:1:x", "error": None, "failure": None,
        "revision": "r2", "stale": stale, "result": result, "result_key": "k",
        "created_at": time, "updated_at": time, "first_seen_at": time, "published_at": None,
        "priority": 3, "concurrency_key": "tenant:1",
    }


def entry_row(time: object, data: object) -> dict[str, object]:
    return {"at": time, "job_id": "j1", "event": "retry_scheduled", "attempt": 2,
            "lease_epoch": 3, "worker_id": "w:1:x", "reason": "boom", "data": data}


@pytest.mark.parametrize("store", [SQLiteStore, PostgresStore])
@pytest.mark.parametrize("name", READS)
def test_each_sql_store_reads_through_the_shared_layer(store: type[SQLStore], name: str) -> None:
    assert issubclass(store, SQLStore)
    assert name not in vars(store)
    assert getattr(store, name) is getattr(SQLStore, name)


def test_a_job_row_from_either_database_maps_to_the_same_job() -> None:
    # Given the same job as each driver returns it
    sqlite_row = job_row(AT.timestamp(), json.dumps(PAYLOAD), json.dumps(RESULT), 1)
    postgres_row = job_row(AT_ELSEWHERE, PAYLOAD, RESULT, True)

    # When each store maps its row
    from_sqlite, from_postgres = SQLiteStore._job(sqlite_row), PostgresStore._job(postgres_row)

    # Then both give one Job, its timestamps in UTC and its JSON decoded
    assert from_sqlite == from_postgres
    assert from_sqlite == Job(
        id="j1", queue="q", status="processing", payload=PAYLOAD, task="ship", attempts=2,
        max_attempts=5, snoozes=1, givebacks=0, lease_until=AT, lease_epoch=3,
        worker_id="w:1:x", revision="r2", stale=True, result=RESULT, result_key="k",
        created_at=AT, updated_at=AT, first_seen_at=AT, published_at=None, priority=3,
        concurrency_key="tenant:1")
    assert from_postgres.lease_until is not None and from_postgres.lease_until.utcoffset() == \
        timedelta(0)


def test_null_json_and_times_stay_none_on_both() -> None:
    sqlite_job = SQLiteStore._job(job_row(None, "{}", None, 0))
    postgres_job = PostgresStore._job(job_row(None, {}, None, False))
    assert sqlite_job == postgres_job
    assert (sqlite_job.result, sqlite_job.lease_until, sqlite_job.stale) == (None, None, False)


@pytest.mark.parametrize("data", [None, {"delay_s": 2.5}])
def test_a_journal_row_from_either_database_maps_to_the_same_entry(
        data: dict[str, float] | None) -> None:
    text = None if data is None else json.dumps(data)
    sqlite_entry = SQLiteStore._entry(entry_row(AT.timestamp(), text))
    postgres_entry = PostgresStore._entry(entry_row(AT_ELSEWHERE, data))
    assert sqlite_entry == postgres_entry == JournalEntry(
        at=AT, job_id="j1", event="retry_scheduled", attempt=2, lease_epoch=3,
        worker_id="w:1:x", reason="boom", data=data)
