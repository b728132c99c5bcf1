"""The PostgreSQL store's operators' tools (DESIGN.md §8): the filtered job page, bulk
actions, edit-and-requeue, bounded counts (the planner's estimate past the cap), journal counts
per hour, table and index health and the worker registry.

Mixed into ``PostgresStore``, whose plumbing (``_read``, ``_rows``, ``_exec``, ``_count``,
``_notify``, ``_session``, ``queries``) it uses; the SQL is in ``queries/operators.sql``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg

from leaseq.browse import (
    ACTION_EVENTS,
    COUNT_CAP,
    SUMMARY_STATUSES,
    BulkAction,
    BulkResult,
    Count,
    Fetch,
    HourlyCount,
    IndexHealth,
    JobFilter,
    JobPage,
    KeyRow,
    QueueSummary,
    TableHealth,
    WorkerInfo,
    actor_reason,
    batches,
    prefix_end,
    time_key,
    walk,
)
from leaseq.errors import JobNotFound
from leaseq.job import Job

#: The open ends of a time range (and the first page's keyset).
_EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
_LATEST = datetime(9999, 12, 30, tzinfo=UTC)


def free_text(value: str | None) -> str | None:
    """Free text as PostgreSQL can store it: a text column cannot hold NUL."""
    return value.replace("\x00", "\ufffd") if value else value


class PostgresOperatorTools:
    """The operators' primitives of the store protocol (see ``leaseq.stores.base``)."""

    queries: dict[str, str]
    options: Any
    _session: Any
    _read: Callable[..., list[dict[str, Any]]]
    _rows: Callable[..., list[dict[str, Any]]]
    _exec: Callable[..., None]
    _count: Callable[..., int]
    _notify: Callable[..., None]
    _job: Callable[[dict[str, Any]], Job]
    _time: Callable[[Any], datetime | None]
    _stamp: Callable[[Any], datetime]

    def find_jobs(self, where: JobFilter, limit: int = 50,
                  cursor: str | None = None) -> JobPage:
        ids, next_cursor, capped = walk(self._walker(where), limit, cursor, read_key=time_key)
        return JobPage(self._get_many(where.queue, ids), next_cursor, capped)

    def _walker(self, where: JobFilter) -> Fetch:
        common: dict[str, Any] = dict(
            queue=where.queue, status=where.status, task=free_text(where.task),
            prefix=free_text(where.id_prefix), error=free_text(where.error_text),
            since=where.updated_from or _EARLIEST, until=where.updated_until or _LATEST)
        if where.status:
            name = "walk_status"
        else:  # a task alone too: no index on task (migration 014)
            name, prefix = "walk_ids", free_text(where.id_prefix) or ""
            common.update(low=prefix, high=prefix_end(prefix) if prefix else "\U0010ffff" * 2)

        def fetch(key: Any, after_id: str | None, n: int) -> list[KeyRow]:
            rows = self._read(name, after_k=key or _LATEST.isoformat(),
                              after_id=after_id or "", n=n, **common)
            return [(r["k"].isoformat() if r["k"] else None, r["id"], bool(r["hit"]))
                    for r in rows]
        return fetch

    def _get_many(self, queue: str, ids: list[str]) -> list[Job]:
        if not ids:
            return []
        rows = {r["id"]: r for r in self._read("get_many", queue=queue, ids=ids)}
        return [self._job(rows[i]) for i in ids if i in rows]

    def act_on_jobs(self, queue: str, action: BulkAction, job_ids: Sequence[str],
                    actor: str) -> BulkResult:
        action = BulkAction(action)
        params = dict(queue=queue, event=ACTION_EVENTS[action],
                      reason=free_text(actor_reason(actor)))
        acted: list[str] = []
        for batch in batches(job_ids):
            rows = self._session.run(lambda conn, b=batch: self._rows(
                conn, f"bulk_{action.value}", ids=b, **params))
            acted.extend(r["id"] for r in rows)
            if action is BulkAction.REQUEUE and rows:
                self._session.run(lambda conn: self._notify(conn, queue))
        return BulkResult.of(job_ids, acted)

    def requeue_edited(self, queue: str, job_id: str, payload_json: str, actor: str) -> bool:
        def work(conn: psycopg.Connection) -> bool:
            if self._rows(conn, "requeue_edited", queue=queue, id=job_id, payload=payload_json,
                          reason=free_text(actor_reason(actor))):
                self._notify(conn, queue)
                return True
            if not self._rows(conn, "exists", queue=queue, id=job_id):
                raise JobNotFound(queue, job_id)
            return False
        return self._session.run(work)

    def journal_hourly(self, queue: str, hours: int) -> list[HourlyCount]:
        return [HourlyCount(self._stamp(r["hour"]), r["event"], int(r["n"]))
                for r in self._read("journal_hourly", queue=queue, hours=hours)]

    def journal_counts(self, queue: str, within_s: float) -> dict[str, int]:
        return {r["event"]: int(r["n"]) for r in self._read(
            "journal_counts", queue=queue, within_s=float(within_s))}

    def queue_summary(self, queue: str, cap: int = COUNT_CAP) -> QueueSummary:
        def work(conn: psycopg.Connection) -> QueueSummary:
            counts = {status: self._capped(conn, queue, status, cap)
                      for status in SUMMARY_STATUSES}
            ready = int(self._rows(conn, "ready_capped", queue=queue, cap=cap)[0]["n"])
            oldest = self._rows(conn, "oldest_ready", queue=queue)
            age = max(float(oldest[0]["age"]), 0.0) if oldest else 0.0
            lapsed = int(self._rows(conn, "lapsed_capped", queue=queue, cap=cap)[0]["n"])
            return QueueSummary(queue, counts, Count(ready, exact=ready < cap), age,
                                Count(lapsed, exact=lapsed < cap))
        return self._session.run(work, idempotent=True)

    def _capped(self, conn: psycopg.Connection, queue: str, status: str, cap: int) -> Count:
        n = int(self._rows(conn, "count_capped", queue=queue, status=status, cap=cap)[0]["n"])
        if n < cap:
            return Count(n)
        with psycopg.ClientCursor(conn) as cur:
            cur.execute(self.queries["estimate_status"], {"queue": queue, "status": status})
            plan = cur.fetchall()[0][0]  # EXPLAIN answers one row
        estimate = int(plan[0]["Plan"]["Plan Rows"])
        return Count(max(estimate, cap), exact=False, estimated=True)

    def table_health(self) -> list[TableHealth]:
        rows = self._read("table_health", schema=self.options.schema)
        return [TableHealth(r["relname"], int(r["n_live_tup"]), int(r["n_dead_tup"]),
                            int(r["size_bytes"]), self._time(r["last_vacuum"]))
                for r in rows]

    def index_health(self) -> list[IndexHealth]:
        # An estimate from the catalog, not pgstatindex(): that reads every page of the index,
        # and doctor's checks stay bounded reads (queries/dashboard.sql says how and its limits).
        schema = self.options.schema
        return [IndexHealth(schema, r["index"], r["table_name"], int(r["size_bytes"]),
                            int(r["bloat_bytes"]))
                for r in self._read("index_health", schema=schema)]

    def register_worker(self, worker_id: str, queues: Sequence[str], in_flight: int) -> None:
        # Safe to retry: a second upsert only moves the beat.
        self._session.run(lambda conn: self._exec(
            conn, "register_worker", worker_id=free_text(worker_id),
            queues=json.dumps(list(queues)), in_flight=in_flight),
            idempotent=True, autocommit=True)

    def unregister_worker(self, worker_id: str) -> None:
        self._session.run(lambda conn: self._exec(
            conn, "unregister_worker", worker_id=free_text(worker_id)),
            idempotent=True, autocommit=True)

    def list_workers(self, limit: int = 1000) -> list[WorkerInfo]:
        return [WorkerInfo(r["worker_id"], list(r["queues"]), r["in_flight"],
                           self._stamp(r["started_at"]), self._stamp(r["last_beat_at"]))
                for r in self._read("list_workers", limit=limit)]

    def prune_workers(self, older_than_s: float) -> int:
        return self._session.run(lambda conn: self._count(
            conn, "prune_workers", older_than_s=older_than_s), idempotent=True, autocommit=True)
