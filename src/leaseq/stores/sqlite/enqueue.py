"""The SQLite store's enqueue: each job looked up and decided (insert, revive, update, mark
stale or leave alone) inside one ``BEGIN IMMEDIATE`` transaction. Mixed into ``SQLiteStore``,
whose plumbing it uses."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from leaseq.errors import JobConflict
from leaseq.job import EnqueueOutcome, EnqueueResult, JobSpec, OnConflict
from leaseq.journal import JournalEvent
from leaseq.stores.base import decide_upsert
from leaseq.stores.sqlite.named import Q


class SQLiteEnqueue:
    """``enqueue_many`` of ``Store`` (see ``leaseq.stores.base``) on SQLite."""

    _tx: Callable[[sqlite3.Connection | None], AbstractContextManager[sqlite3.Connection]]
    _rows: Callable[..., list[dict[str, Any]]]
    _params: Callable[..., dict[str, Any]]
    _journal: Callable[..., None]

    # --- producers -------------------------------------------------------------------------

    def enqueue_many(self, queue: str, specs: Sequence[JobSpec], on_conflict: OnConflict = "raise",
                     connection: Any = None) -> list[EnqueueResult]:
        if connection is not None and not isinstance(connection, sqlite3.Connection):
            raise TypeError("connection= must be a sqlite3.Connection on the SQLite store")
        with self._tx(connection) as conn:
            return self._enqueue(conn, queue, specs, on_conflict)

    def _enqueue(self, conn: sqlite3.Connection, queue: str, specs: Sequence[JobSpec],
                 on_conflict: OnConflict) -> list[EnqueueResult]:
        results: list[EnqueueResult] = []
        conflicts: list[str] = []
        for spec in specs:
            found = self._rows(conn, "find_existing", queue=queue, id=spec.job_id)
            outcome = self._upsert(conn, queue, spec, found[0] if found else None, on_conflict)
            if outcome is EnqueueOutcome.CONFLICT and on_conflict == "raise":
                conflicts.append(spec.job_id)
            results.append(EnqueueResult(spec.job_id, outcome))
        if conflicts:
            raise JobConflict(queue, conflicts)  # the transaction rolls back
        return results

    def _upsert(self, conn: sqlite3.Connection, queue: str, spec: JobSpec,
                old: dict[str, Any] | None, on_conflict: OnConflict) -> EnqueueOutcome:
        params = self._params(queue=queue, id=spec.job_id, task=spec.task,
                              payload=spec.payload_json, revision=spec.revision,
                              delay_s=spec.delay_s, max_attempts=spec.max_attempts,
                              priority=spec.priority, concurrency_key=spec.concurrency_key)
        if old is None:
            conn.execute(Q["insert_job"], params)
            return self._enqueued(conn, queue, spec, EnqueueOutcome.CREATED)
        outcome = decide_upsert(old["status"], old["payload"], old["revision"], spec,
                                on_conflict)
        if outcome is EnqueueOutcome.REVIVED:
            conn.execute(Q["revive_job"], params)
        elif outcome is EnqueueOutcome.UPDATED:
            live = "mark_stale" if old["status"] == "processing" else "update_pending"
            conn.execute(Q[live], params)
        else:
            return outcome
        return self._enqueued(conn, queue, spec, outcome)

    def _enqueued(self, conn: sqlite3.Connection, queue: str, spec: JobSpec,
                  outcome: EnqueueOutcome) -> EnqueueOutcome:
        self._journal(conn, queue, spec.job_id, JournalEvent.ENQUEUED, reason=outcome.value,
                      data={"revision": spec.revision} if spec.revision else None)
        return outcome
