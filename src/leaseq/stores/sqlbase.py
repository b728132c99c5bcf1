"""What SQLite and PostgreSQL read alike: the inspection methods and the row → record mapping.

Both stores hold the same tables and answer the same named read queries (``now``, ``queues``,
``get``, ``list_jobs``, ``counts``, ``ready``, ``in_flight``, ``journal``, ``outbox_due`` in their
``queries/*.sql``), so the methods that run them and turn rows into ``Job`` and ``JournalEntry``
are written here once, on two hooks a store supplies:

* ``_read(name, **params)``: run one of its named read queries, the rows as dicts;
* ``_time(value)``, ``_stamp(value)`` and ``_json(value)``: decode what its driver hands back
  in the database's own types (SQLite: Unix seconds and JSON text; PostgreSQL:
  ``timestamptz`` and ``json``, which psycopg decodes itself).

The writes stay in each store: what is atomic, and how, is each database's own.
"""

from __future__ import annotations

import abc
from datetime import datetime
from typing import Any

from leaseq.job import Job, JournalEntry
from leaseq.stores.base import Store


class SQLStore(Store):
    """A store whose reads are named SQL queries over leaseq's jobs and journal tables."""

    # --- the hooks --------------------------------------------------------------------------

    @abc.abstractmethod
    def _read(self, name: str, **params: Any) -> list[dict[str, Any]]:
        """The rows of the read query ``name`` (from ``queries/*.sql``), column name → value."""

    @staticmethod
    @abc.abstractmethod
    def _time(value: Any) -> datetime | None:
        """A timestamp column as a timezone-aware UTC datetime; NULL as None."""

    @staticmethod
    @abc.abstractmethod
    def _stamp(value: Any) -> datetime:
        """A NOT NULL timestamp column as a timezone-aware UTC datetime."""

    @staticmethod
    @abc.abstractmethod
    def _json(value: Any) -> Any:
        """A JSON column as Python values; NULL as None."""

    # --- rows → records ---------------------------------------------------------------------

    @classmethod
    def _job(cls, row: dict[str, Any]) -> Job:
        time, decode = cls._time, cls._json
        return Job(
            id=row["id"], queue=row["queue"], status=row["status"],
            payload=decode(row["payload"]), task=row["task"], attempts=row["attempts"],
            max_attempts=row["max_attempts"], snoozes=row["snoozes"], givebacks=row["givebacks"],
            lease_until=time(row["lease_until"]),
            lease_epoch=row["lease_epoch"], worker_id=row["worker_id"], error=row["error"],
            failure=row["failure"], revision=row["revision"], stale=bool(row["stale"]),
            result=decode(row["result"]), result_key=row["result_key"],
            created_at=time(row["created_at"]), updated_at=time(row["updated_at"]),
            first_seen_at=time(row["first_seen_at"]), published_at=time(row["published_at"]),
            priority=row["priority"], concurrency_key=row["concurrency_key"],
            claim_token=None if (token := row.get("claim_token")) is None else str(token),
        )

    @classmethod
    def _entry(cls, row: dict[str, Any]) -> JournalEntry:
        return JournalEntry(
            at=cls._stamp(row["at"]), job_id=row["job_id"],
            event=row["event"], attempt=row["attempt"], lease_epoch=row["lease_epoch"],
            worker_id=row["worker_id"], reason=row["reason"], data=cls._json(row["data"]),
        )

    # --- set-up -----------------------------------------------------------------------------

    def server_now(self) -> datetime:
        return self._stamp(self._read("now")[0]["now"])

    def queues(self) -> list[str]:
        return [r["queue"] for r in self._read("queues")]

    # --- inspection -------------------------------------------------------------------------

    def get(self, queue: str, job_id: str) -> Job | None:
        rows = self._read("get", queue=queue, id=job_id)
        return self._job(rows[0]) if rows else None

    def list_jobs(self, queue: str, status: str | None = None, limit: int = 100,
                  after_id: str | None = None) -> list[Job]:
        rows = self._read("list_jobs", queue=queue, status=status, limit=limit,
                          after_id=after_id or "")
        return [self._job(r) for r in rows]

    def counts(self, queue: str) -> dict[str, int]:
        return {r["status"]: int(r["n"]) for r in self._read("counts", queue=queue)}

    def ready_stats(self, queue: str) -> tuple[int, float]:
        row = self._read("ready", queue=queue)[0]
        age = row["age"]
        return int(row["n"]), max(float(age), 0.0) if age is not None else 0.0

    def in_flight(self, queue: str) -> int:
        return int(self._read("in_flight", queue=queue)[0]["n"])

    def journal(self, queue: str, job_id: str) -> list[JournalEntry]:
        return [self._entry(r) for r in self._read("journal", queue=queue, id=job_id)]

    def outbox_due(self, queue: str, limit: int) -> list[Job]:
        return [self._job(r) for r in self._read("outbox_due", queue=queue, limit=limit)]
