"""The SQLite store's schedule ledger (periodic jobs, docs/periodic.md): register, read,
advance, pause and retire schedules, each write with its journal entries in the same
``BEGIN IMMEDIATE`` transaction. Mixed into ``SQLiteStore``, whose plumbing it uses."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

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


class ScheduleLedger:
    """The ledger primitives of ``Store`` (see ``leaseq.stores.base``) on SQLite."""

    _tx: Callable[[], AbstractContextManager[sqlite3.Connection]]
    _rows: Callable[..., list[dict[str, Any]]]
    _read: Callable[..., list[dict[str, Any]]]
    _journal: Callable[..., None]
    _enqueue: Callable[[sqlite3.Connection, str, Sequence[JobSpec], OnConflict],
                       list[EnqueueResult]]
    notify_local: Callable[[str], None]
    _time: Callable[[Any], datetime | None]
    _stamp: Callable[[Any], datetime]

    def register_schedule(self, name: str, queue: str, spec_json: str,
                          queues: Sequence[str] = ()) -> ScheduleState:
        with self._tx() as conn:
            old = self._rows(conn, "schedule_get", schedule=name)
            params = {"schedule": name, "queue": queue, "spec": spec_json,
                      "queues": json.dumps(list(queues)), "revive_grace_s": REVIVE_GRACE_S}
            if not old and self._rows(conn, "schedule_insert", **params):
                self._journal(conn, queue, schedule_journal_id(name),
                              ScheduleEvent.REGISTERED.value, reason=SCHEDULE_REGISTERED)
            elif old and self._rows(conn, "schedule_respec", **params):
                self._journal(conn, queue, schedule_journal_id(name),
                              ScheduleEvent.CHANGED.value, reason=SCHEDULE_CHANGED,
                              data=schedule_changes(old[0], queue, spec_json))
            state = self._schedule(self._rows(conn, "schedule_get", schedule=name)[0])
        return owned(state, queue)

    def schedule_state(self, name: str) -> ScheduleState | None:
        rows = self._read("schedule_get", schedule=name)
        return self._schedule(rows[0]) if rows else None

    def schedules(self) -> list[ScheduleState]:
        return [self._schedule(r) for r in self._read("schedule_list")]

    def advance_schedule(self, name: str, version: int, advance: TickAdvance) -> bool:
        last_tick, last_job = advance.last or (None, None)
        with self._tx() as conn:
            rows = self._rows(conn, "schedule_advance", schedule=name, version=version,
                              cursor=advance.cursor.timestamp(), skipped=len(advance.skipped),
                              last_tick=last_tick.timestamp() if last_tick else None,
                              last_job_id=last_job)
            if not rows:
                return False
            queue = rows[0]["queue"]
            if advance.jobs:
                self._enqueue(conn, queue, [spec for _, spec in advance.jobs], "keep")
            for event, reason, data in advance.journal():
                self._journal(conn, queue, schedule_journal_id(name), event, reason=reason,
                              data=data)
        if advance.jobs:
            self.notify_local(queue)
        return True

    def trigger_schedule(self, name: str, queue: str, spec: JobSpec) -> bool:
        with self._tx() as conn:
            if not self._rows(conn, "schedule_trigger", schedule=name, queue=queue,
                              job_id=spec.job_id):
                return False
            self._enqueue(conn, queue, [spec], "keep")
            self._journal(conn, queue, schedule_journal_id(name),
                          ScheduleEvent.TICK_MANUAL.value, reason=OPERATOR,
                          data={"job": spec.job_id})
        self.notify_local(queue)
        return True

    def pause_schedule(self, name: str, paused: bool) -> bool:
        event = ScheduleEvent.PAUSED if paused else ScheduleEvent.RESUMED
        with self._tx() as conn:
            rows = self._rows(conn, "schedule_pause", schedule=name, paused=int(paused))
            for row in rows:
                self._journal(conn, row["queue"], schedule_journal_id(name), event.value,
                              reason=OPERATOR)
        return bool(rows)

    def deactivate_schedules(self, queues: Sequence[str], keep: Sequence[str]) -> list[str]:
        with self._tx() as conn:
            rows = self._rows(conn, "schedule_deactivate", queues=json.dumps(list(queues)),
                              keep=json.dumps(list(keep)))
            for row in rows:
                self._journal(conn, row["queue"], schedule_journal_id(row["name"]),
                              ScheduleEvent.INACTIVE.value, reason=SCHEDULE_GONE)
        return sorted(r["name"] for r in rows)

    def _schedule(self, row: dict[str, Any]) -> ScheduleState:
        return ScheduleState(
            name=row["name"], queue=row["queue"], spec_json=row["spec"],
            cursor=self._stamp(row["cursor"]), version=row["version"],
            last_tick=self._time(row["last_tick"]), last_job_id=row["last_job_id"],
            skipped=row["skipped"], paused=bool(row["paused"]), active=bool(row["active"]),
            updated_at=self._time(row["updated_at"]))

