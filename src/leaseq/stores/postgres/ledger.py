"""The PostgreSQL store's schedule ledger (periodic jobs, docs/periodic.md): register, read,
advance, pause and retire schedules, each write with its journal entries in one transaction.
Mixed into ``PostgresStore``, whose plumbing it uses."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg

from leaseq.job import EnqueueResult, JobSpec, OnConflict
from leaseq.journal import OPERATOR, SCHEDULE_CHANGED, SCHEDULE_GONE, SCHEDULE_REGISTERED
from leaseq.ledger import (
    REVIVE_GRACE_S,
    ScheduleEvent,
    ScheduleState,
    TickAdvance,
    owned,
    schedule_changes,
    schedule_journal_id,
)
from leaseq.stores.postgres.session import Sessions


class ScheduleLedger:
    """The ledger primitives of ``Store`` (see ``leaseq.stores.base``) on PostgreSQL."""

    _session: Sessions
    _rows: Callable[..., list[dict[str, Any]]]
    _read: Callable[..., list[dict[str, Any]]]
    _exec: Callable[..., None]
    _enqueue: Callable[[psycopg.Connection, str, Sequence[JobSpec], OnConflict],
                       list[EnqueueResult]]
    notify_local: Callable[[str], None]

    def register_schedule(self, name: str, queue: str, spec_json: str,
                          queues: Sequence[str] = ()) -> ScheduleState:
        params = {"schedule": name, "queue": queue, "spec": spec_json, "queues": list(queues),
                  "revive_grace_s": REVIVE_GRACE_S}

        def work(conn: psycopg.Connection) -> ScheduleState:
            if self._rows(conn, "schedule_insert", **params):
                self._log_schedule(conn, queue, name, ScheduleEvent.REGISTERED, SCHEDULE_REGISTERED)
            else:
                old = self._rows(conn, "schedule_lock", schedule=name)[0]
                if self._rows(conn, "schedule_respec", **params):
                    self._log_schedule(conn, queue, name, ScheduleEvent.CHANGED,
                                       SCHEDULE_CHANGED, schedule_changes(old, queue, spec_json))
            return _schedule(self._rows(conn, "schedule_get", schedule=name)[0])
        return owned(self._session.run(work), queue)

    def _log_schedule(self, conn: psycopg.Connection, queue: str, name: str, event: str,
                      reason: str, data: Mapping[str, Any] | None = None) -> None:
        self._exec(conn, "append_journal", queue=queue, id=schedule_journal_id(name),
                   event=str(event), attempt=None, lease_epoch=None, worker_id=None,
                   reason=reason, data=json.dumps(dict(data)) if data else None)

    def schedule_state(self, name: str) -> ScheduleState | None:
        rows = self._read("schedule_get", schedule=name)
        return _schedule(rows[0]) if rows else None

    def schedules(self) -> list[ScheduleState]:
        return [_schedule(r) for r in self._read("schedule_list")]

    def advance_schedule(self, name: str, version: int, advance: TickAdvance) -> bool:
        last_tick, last_job = advance.last or (None, None)

        def work(conn: psycopg.Connection) -> str | None:
            rows = self._rows(conn, "schedule_advance", schedule=name, version=version,
                              cursor=advance.cursor, skipped=len(advance.skipped),
                              last_tick=last_tick, last_job_id=last_job)
            if not rows:
                return None
            queue: str = rows[0]["queue"]
            if advance.jobs:  # NOTIFYs the workers at commit
                self._enqueue(conn, queue, [spec for _, spec in advance.jobs], "keep")
            for event, reason, data in advance.journal():
                self._log_schedule(conn, queue, name, event, reason, data)
            return queue
        queue = self._session.run(work)
        if queue is not None and advance.jobs:
            self.notify_local(queue)
        return queue is not None

    def trigger_schedule(self, name: str, queue: str, spec: JobSpec) -> bool:
        def work(conn: psycopg.Connection) -> bool:
            if not self._rows(conn, "schedule_trigger", schedule=name, queue=queue,
                              job_id=spec.job_id):
                return False
            self._enqueue(conn, queue, [spec], "keep")  # NOTIFYs the workers at commit
            self._log_schedule(conn, queue, name, ScheduleEvent.TICK_MANUAL, OPERATOR,
                               {"job": spec.job_id})
            return True
        triggered = self._session.run(work)
        if triggered:
            self.notify_local(queue)
        return triggered

    def pause_schedule(self, name: str, paused: bool) -> bool:
        event = ScheduleEvent.PAUSED if paused else ScheduleEvent.RESUMED

        def work(conn: psycopg.Connection) -> bool:
            rows = self._rows(conn, "schedule_pause", schedule=name, paused=paused)
            for row in rows:
                self._log_schedule(conn, row["queue"], name, event, OPERATOR)
            return bool(rows)
        return self._session.run(work)

    def deactivate_schedules(self, queues: Sequence[str], keep: Sequence[str]) -> list[str]:
        def work(conn: psycopg.Connection) -> list[str]:
            rows = self._rows(conn, "schedule_deactivate", queues=list(queues), keep=list(keep))
            for row in rows:
                self._log_schedule(conn, row["queue"], row["name"], ScheduleEvent.INACTIVE,
                                   SCHEDULE_GONE)
            return sorted(r["name"] for r in rows)
        return self._session.run(work)

def _schedule(row: dict[str, Any]) -> ScheduleState:
    return ScheduleState(
        name=row["name"], queue=row["queue"], spec_json=row["spec"],
        # cursor is NOT NULL
        cursor=row["cursor"].astimezone(UTC), version=row["version"],
        last_tick=_utc(row["last_tick"]), last_job_id=row["last_job_id"],
        skipped=row["skipped"], paused=row["paused"], active=row["active"],
        updated_at=_utc(row["updated_at"]))


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)
