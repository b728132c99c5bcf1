"""The careful enqueue's plan: what a batch writes, decided per spec under the rows' locks.

Used when the one-statement enqueue cannot decide alone (an existing job would change or
conflict, an id repeats in the batch, a concurrent enqueue won an insert race).
"""

from __future__ import annotations

import json
from typing import Any

from leaseq.job import EnqueueOutcome, EnqueueResult, JobSpec, OnConflict
from leaseq.stores.base import decide_upsert


def enqueued_data(spec: JobSpec) -> str | None:
    """The ``enqueued`` journal row's data: the revision written, when there is one. Every
    enqueue path writes this same text."""
    return json.dumps({"revision": spec.revision}) if spec.revision else None


class EnqueuePlan:
    """What one enqueue batch will write, decided under the batch's row locks."""

    def __init__(self, queue: str):
        self.queue = queue
        self.results: list[EnqueueResult] = []
        self.conflicts: list[str] = []
        self.inserts: list[JobSpec] = []
        self.updates: list[tuple[str, dict[str, Any]]] = []
        self.journal: list[tuple[str, str, str | None]] = []

    def decide(self, spec: JobSpec, old: dict[str, Any] | None, on_conflict: OnConflict) -> None:
        if old is None:
            outcome = EnqueueOutcome.CREATED
            self.inserts.append(spec)
        else:
            outcome = decide_upsert(old["status"], old["payload"], old["revision"], spec,
                                    on_conflict)
            self._update(spec, old, outcome)
        if outcome is EnqueueOutcome.CONFLICT:
            self.conflicts.append(spec.job_id)
        elif outcome is not EnqueueOutcome.UNCHANGED:
            data = enqueued_data(spec)
            if outcome is not EnqueueOutcome.CREATED or data is not None:
                # A bare creation is told by the record itself (see journal in read.sql).
                self.journal.append((spec.job_id, outcome.value, data))
        self.results.append(EnqueueResult(spec.job_id, outcome))

    @property
    def writes(self) -> bool:
        """Whether the batch inserts or changes a job (and so owes a NOTIFY)."""
        return bool(self.inserts or self.updates)

    def _update(self, spec: JobSpec, old: dict[str, Any], outcome: EnqueueOutcome) -> None:
        """Queue the write for an existing row, and track its new state for later specs of
        the same id in this batch."""
        if outcome is EnqueueOutcome.REVIVED:
            name = "revive_job"
            old["status"] = "pending"
        elif outcome is EnqueueOutcome.UPDATED:
            name = "mark_stale" if old["status"] == "processing" else "update_pending"
        else:
            return
        old.update(payload=spec.payload_json, revision=spec.revision)
        self.updates.append((name, {
            "queue": self.queue, "id": spec.job_id, "task": spec.task,
            "payload": spec.payload_json, "revision": spec.revision,
            "delay_s": spec.delay_s, "max_attempts": spec.max_attempts,
            "priority": spec.priority, "concurrency_key": spec.concurrency_key}))

    @staticmethod
    def inserted_row(spec: JobSpec) -> dict[str, Any]:
        return {"status": "pending", "payload": spec.payload_json, "revision": spec.revision}

    def insert_columns(self) -> dict[str, Any]:
        specs = self.inserts
        return {"queue": self.queue, "ids": [s.job_id for s in specs],
                "tasks": [s.task for s in specs], "payloads": [s.payload_json for s in specs],
                "revisions": [s.revision for s in specs],
                "delays": [float(s.delay_s) for s in specs],
                "max_attempts": [s.max_attempts for s in specs],
                "priorities": [s.priority for s in specs],
                "keys": [s.concurrency_key for s in specs]}

    def journal_columns(self) -> dict[str, Any]:
        ids, reasons, data = zip(*self.journal, strict=True)
        return {"queue": self.queue, "ids": list(ids), "reasons": list(reasons),
                "data": list(data)}
