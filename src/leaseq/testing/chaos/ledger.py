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

    def effects(self) -> dict[tuple[str, str], int]:
        """``(job id, effect)`` → the epoch that first made it; ``{}`` when nothing was made."""
        with self._lock:
            rows = self._conn.execute("SELECT job_id, effect, lease_epoch FROM effects")
            return {(job_id, effect): epoch for job_id, effect, epoch in rows.fetchall()}

    def repeats(self) -> list[tuple[str, str, int]]:
        """``(job id, effect, epoch)`` of every later attempt at a key, in the order made."""
        with self._lock:
            return self._conn.execute(
                "SELECT job_id, effect, lease_epoch FROM repeats ORDER BY rowid").fetchall()

    def classify(self, jobs: Mapping[str, Job], finished: Mapping[str, int] | None = None
                 ) -> tuple[int, int, list[str]]:
        """``(duplicates, fenced_reruns, details)`` over every repeat, see the module doc.

        A repeat is compared with the first making of the *same* key. ``finished`` maps a job
        id to the epoch of its *first* terminal transition (from its journal); without an entry
        the epoch of a terminal job stands in, which cannot see a job finished twice."""
        first = self.effects()
        finished = finished or {}
        duplicates, reruns, details = 0, 0, []
        for job_id, effect, epoch in self.repeats():
            job = jobs.get(job_id)
            finished_at = finished.get(job_id)
            if finished_at is None and job is not None and is_terminal(job.status):
                finished_at = job.lease_epoch
            made_by = first.get((job_id, effect))
            if epoch == made_by or (finished_at is not None and epoch > finished_at):
                duplicates += 1
                details.append(f"{job_id}: {effect} repeated by epoch {epoch} "
                               f"(first by {made_by}, finished at {finished_at})")
            else:
                reruns += 1
        return duplicates, reruns, details

    def close(self) -> None:
        with self._lock:
            self._conn.close()
