"""The SQLite store's operators' tools (DESIGN.md §8): the filtered job page, bulk actions,
edit-and-requeue, bounded counts, journal counts per hour and the worker registry.

Mixed into ``SQLiteStore``, whose plumbing (``_read``, ``_rows``, ``_tx``, ``_journal_rows``,
``_lock``) it uses; the SQL is in ``queries/operators.sql`` beside the other topics.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from leaseq.browse import (
    ACTION_EVENTS,
    COUNT_CAP,
    SUMMARY_STATUSES,
    BulkAction,
    BulkResult,
    Count,
    Fetch,
    HourlyCount,
    JobFilter,
    JobPage,
    KeyRow,
    QueueSummary,
    WorkerInfo,
    actor_reason,
    batches,
    number_key,
    prefix_end,
    walk,
)
from leaseq.errors import JobNotFound
from leaseq.job import Job
from leaseq.journal import JournalEvent

#: Beyond any timestamp: the open end of a time range or of the first page's keyset.
_FAR = 1e300


class SQLiteOperatorTools:
    """The operators' primitives of the store protocol (see ``leaseq.stores.base``)."""

    _lock: AbstractContextManager[Any]  # an RLock; DjangoSQLiteStore's a nullcontext
    _read: Callable[..., list[dict[str, Any]]]
    _rows: Callable[..., list[dict[str, Any]]]
    _tx: Callable[..., AbstractContextManager[sqlite3.Connection]]
    _journal_rows: Callable[..., None]
    _job: Callable[[dict[str, Any]], Job]
    _time: Callable[[Any], datetime | None]
    _stamp: Callable[[Any], datetime]

    def find_jobs(self, where: JobFilter, limit: int = 50,
                  cursor: str | None = None) -> JobPage:
        ids, next_cursor, capped = walk(self._walker(where), limit, cursor, read_key=number_key)
        return JobPage(self._get_many(where.queue, ids), next_cursor, capped)

    def _walker(self, where: JobFilter) -> Fetch:
        since = where.updated_from.timestamp() if where.updated_from else -_FAR
        until = where.updated_until.timestamp() if where.updated_until else _FAR
        common = dict(queue=where.queue, task=where.task, prefix=where.id_prefix,
                      error=where.error_text, since=since, until=until, status=where.status)
        if where.status:
            name = "walk_status"
        elif where.task:
            name = "walk_task"
        else:
            name, prefix = "walk_ids", where.id_prefix or ""
            common.update(low=prefix, high=prefix_end(prefix) if prefix else "\U0010ffff" * 2)

        def fetch(key: Any, after_id: str | None, n: int) -> list[KeyRow]:
            rows = self._read(name, after_k=_FAR if key is None else float(key),
                              after_id=after_id or "", n=n, **common)
            return [(r["k"], r["id"], bool(r["hit"])) for r in rows]
        return fetch

    def _get_many(self, queue: str, ids: list[str]) -> list[Job]:
        if not ids:
            return []
        rows = {r["id"]: r for r in self._read("get_many", queue=queue, ids=json.dumps(ids))}
        return [self._job(rows[i]) for i in ids if i in rows]

    def act_on_jobs(self, queue: str, action: BulkAction, job_ids: Sequence[str],
                    actor: str) -> BulkResult:
        action = BulkAction(action)
        reason = actor_reason(actor)
        acted: list[str] = []
        for batch in batches(job_ids):
            with self._tx() as conn:
                rows = self._rows(conn, f"bulk_{action.value}", queue=queue,
                                  ids=json.dumps(batch))
                self._journal_rows(conn, queue, rows, ACTION_EVENTS[action], lambda _: reason)
            acted.extend(r["id"] for r in rows)
        return BulkResult.of(job_ids, acted)

    def requeue_edited(self, queue: str, job_id: str, payload_json: str, actor: str) -> bool:
        reason = actor_reason(actor)
        with self._tx() as conn:
            rows = self._rows(conn, "requeue_edited", queue=queue, id=job_id,
                              payload=payload_json)
            if not rows:
                if not self._rows(conn, "exists", queue=queue, id=job_id):
                    raise JobNotFound(queue, job_id)
                return False
            self._journal_rows(conn, queue, rows, JournalEvent.EDITED, lambda _: reason)
            self._journal_rows(conn, queue, rows, JournalEvent.REQUEUED, lambda _: reason)
        return True

    def journal_hourly(self, queue: str, hours: int) -> list[HourlyCount]:
        return [HourlyCount(self._stamp(r["hour"]), r["event"], int(r["n"]))
                for r in self._read("journal_hourly", queue=queue, hours=hours)]

    def journal_counts(self, queue: str, within_s: float) -> dict[str, int]:
        return {r["event"]: int(r["n"]) for r in self._read(
            "journal_counts", queue=queue, within_s=float(within_s))}

    def queue_summary(self, queue: str, cap: int = COUNT_CAP) -> QueueSummary:
        with self._lock:  # one read transaction's worth of statements, one after another
            counts = {status: self._capped("count_capped", cap, queue=queue, status=status)
                      for status in SUMMARY_STATUSES}
            ready = self._capped("ready_capped", cap, queue=queue)
            oldest = self._read("oldest_ready", queue=queue)
            lapsed = self._capped("lapsed_capped", cap, queue=queue)
        return QueueSummary(queue, counts, ready, max(float(oldest[0]["age"]), 0.0)
                            if oldest else 0.0, lapsed)

    def _capped(self, name: str, cap: int, **params: Any) -> Count:
        n = int(self._read(name, cap=cap, **params)[0]["n"])
        return Count(n, exact=n < cap)

    def register_worker(self, worker_id: str, queues: Sequence[str], in_flight: int) -> None:
        with self._tx() as conn:
            self._rows(conn, "register_worker", worker_id=worker_id,
                       queues=json.dumps(list(queues)), in_flight=in_flight)

    def unregister_worker(self, worker_id: str) -> None:
        with self._tx() as conn:
            self._rows(conn, "unregister_worker", worker_id=worker_id)

    def list_workers(self, limit: int = 1000) -> list[WorkerInfo]:
        return [WorkerInfo(r["worker_id"], json.loads(r["queues"]), r["in_flight"],
                           self._stamp(r["started_at"]), self._stamp(r["last_beat_at"]))
                for r in self._read("list_workers", limit=limit)]

    def prune_workers(self, older_than_s: float) -> int:
        with self._tx() as conn:
            return len(self._rows(conn, "prune_workers", older_than_s=older_than_s))
