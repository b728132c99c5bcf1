"""The effects ledger: every side effect a chaos handler makes, under a UNIQUE key, so that a
run counts duplicates instead of assuming there are none (see ``Ledger.classify``)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Mapping
from typing import Any

from leaseq.job import Job, is_terminal

LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    key TEXT NOT NULL UNIQUE, job_id TEXT NOT NULL, effect TEXT NOT NULL,
    lease_epoch INTEGER NOT NULL, worker TEXT, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS repeats (
    key TEXT NOT NULL, job_id TEXT NOT NULL, effect TEXT NOT NULL,
    lease_epoch INTEGER NOT NULL, worker TEXT, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS facts (name TEXT NOT NULL, job_id TEXT, value TEXT);
"""


class Ledger:
    """Side effects under a UNIQUE key, shared by every process of a run (a SQLite file in
    WAL mode: a process killed mid-write leaves it consistent)."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                                     timeout=60)
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.executescript(LEDGER_SCHEMA)

    def record(self, job: Job, effect: str, worker: str | None = None) -> bool:
        """Make the effect once per key; True the first time, False for a repeat (kept)."""
        row = (f"{job.id}\x1f{effect}", job.id, effect, job.lease_epoch, worker, time.time())
        with self._lock:
            try:
                self._conn.execute("INSERT INTO effects VALUES (?, ?, ?, ?, ?, ?)", row)
                return True
            except sqlite3.IntegrityError:
                self._conn.execute("INSERT INTO repeats VALUES (?, ?, ?, ?, ?, ?)", row)
                return False

    def fact(self, name: str, job_id: str | None = None, value: Any = None) -> None:
        """Something a handler saw that the scenario checks afterwards (e.g. its clock)."""
        with self._lock:
            self._conn.execute("INSERT INTO facts VALUES (?, ?, ?)",
                               (name, job_id, json.dumps(value)))

    def facts(self, name: str) -> list[tuple[str | None, Any]]:
        with self._lock:
            rows = self._conn.execute("SELECT job_id, value FROM facts WHERE name = ?", (name,))
            return [(job_id, json.loads(value)) for job_id, value in rows.fetchall()]

    def effects(self) -> dict[str, int]:
        """Job id → epoch of its first recorded effect."""
        with self._lock:
            rows = self._conn.execute("SELECT job_id, lease_epoch FROM effects").fetchall()
        return dict(rows)

    def repeats(self) -> list[tuple[str, int]]:
        with self._lock:
            return self._conn.execute("SELECT job_id, lease_epoch FROM repeats").fetchall()

    def classify(self, jobs: Mapping[str, Job]) -> tuple[int, int, list[str]]:
        """``(duplicates, fenced_reruns, details)`` over every repeat, see the module doc."""
        first = self.effects()
        duplicates, reruns, details = 0, 0, []
        for job_id, epoch in self.repeats():
            job = jobs.get(job_id)
            finished_at = job.lease_epoch if job is not None and is_terminal(job.status) else None
            if epoch == first.get(job_id) or (finished_at is not None and epoch > finished_at):
                duplicates += 1
                details.append(f"{job_id}: effect repeated by epoch {epoch} "
                               f"(first by {first.get(job_id)}, finished at {finished_at})")
            else:
                reruns += 1
        return duplicates, reruns, details

    def close(self) -> None:
        with self._lock:
            self._conn.close()
