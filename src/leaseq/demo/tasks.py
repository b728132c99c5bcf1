"""The demo's pipeline: ``fetch`` an image, then make its ``thumbnail``.

Each side effect (the download, the thumbnail) is written to a separate SQLite file under the
job's effect key (UNIQUE), the way a remote API keyed by an idempotency key would take it. An
attempt that repeats an effect (a job run again after its worker was SIGKILLed mid-job) is
recorded as a repeat, so the demo can count duplicates instead of assuming there are none.

Which images misbehave is decided by a hash of the image name, so a replay behaves the same.
Where the demo's SIGKILL lands is decided by ``CrashPoint``: inside a running handler.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import time
from typing import Any

from leaseq.app import App, Finish
from leaseq.job import Job

DEMO_LEASE_S = 2.0
DEMO_HEARTBEAT_S = 0.5
DEMO_MAX_ATTEMPTS = 4
SLOW_JOB_S = 3.0
"""Longer than the lease: a slow thumbnail survives only through its heartbeat."""
PARKED_S = 60.0
"""How long the crash point's handler waits for its SIGKILL before it gives up and goes on
(only if the demo itself died meanwhile)."""

# Per mille of images, by hash: 10 % flaky (2 % of them twice), 1 % poison, a few slow.
FLAKY_PER_MILLE = 100
FLAKY_TWICE_PER_MILLE = 20
PERMANENT_PER_MILLE = 5
CRASHING_PER_MILLE = 5
SLOW_PER_MILLE = 4

EFFECTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    key TEXT PRIMARY KEY, kind TEXT NOT NULL, subject TEXT NOT NULL, job_id TEXT NOT NULL,
    lease_epoch INTEGER NOT NULL, worker_id TEXT, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS effect_repeats (
    key TEXT NOT NULL, job_id TEXT NOT NULL, lease_epoch INTEGER NOT NULL, worker_id TEXT,
    at REAL NOT NULL);
"""


class CorruptImage(Exception):
    """The image can never be decoded: listed as permanent on the task."""


class Effects:
    """The side-effect ledger: one row per effect key; a second attempt at a key is a repeat."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                   timeout=30)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(EFFECTS_SCHEMA)
            self._conn = conn
        return self._conn

    def apply(self, job: Job, kind: str, subject: str) -> bool:
        """Make the effect once per effect key. False when this key was already made (the
        repeat is recorded, not made again)."""
        key = job.effect_key(kind)
        with self._lock:
            db = self._db()
            made = db.execute(
                "INSERT INTO effects VALUES (?, ?, ?, ?, ?, ?, julianday('now')) "
                "ON CONFLICT (key) DO NOTHING",
                (key, kind, subject, job.id, job.lease_epoch, job.worker_id)).rowcount
            if not made:
                db.execute("INSERT INTO effect_repeats VALUES (?, ?, ?, ?, julianday('now'))",
                           (key, job.id, job.lease_epoch, job.worker_id))
        return bool(made)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class CrashPoint:
    """Makes the demo's SIGKILL land while a worker holds a job, whatever the timing.

    The demo requests the crash by creating ``crash-requested`` in its folder while work
    remains (it holds part of the batch back until then). The first handler to start after
    that, in any worker process, creates ``crash-victim`` (O_EXCL: one winner), writes its pid
    there and waits, holding its job, for the demo to SIGKILL its process. Watching the store
    for a worker that holds jobs instead races the pipeline: a small run can end between two
    looks, and a job seen held can finish before the kill lands.
    """

    def __init__(self, folder: str):
        self.requested_path = os.path.join(folder, "crash-requested")
        self.victim_path = os.path.join(folder, "crash-victim")
        self._passed = False  # another handler won: nothing more to check in this process

    def request(self) -> None:
        with open(self.requested_path, "w", encoding="ascii"):
            pass

    def victim_pid(self) -> int | None:
        """The pid of the process parked at the crash point; None until one is."""
        try:
            with open(self.victim_path, encoding="ascii") as fh:
                return int(fh.read())
        except (FileNotFoundError, ValueError):  # not there yet, or its pid half written
            return None

    def reached(self) -> None:
        """Called by each handler as it starts: parks the first one after the request."""
        if self._passed or not os.path.exists(self.requested_path):
            return
        try:
            fd = os.open(self.victim_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            self._passed = True
            return
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(str(os.getpid()))
        time.sleep(PARKED_S)


def fate(source: str) -> str:
    """How this image behaves: ``ok``, ``flaky``, ``flaky_twice``, ``corrupt``, ``crashing``
    or ``slow``."""
    n = int(hashlib.sha256(source.encode()).hexdigest()[:8], 16) % 1000
    for name, share in (("flaky_twice", FLAKY_TWICE_PER_MILLE),
                        ("flaky", FLAKY_PER_MILLE - FLAKY_TWICE_PER_MILLE),
                        ("corrupt", PERMANENT_PER_MILLE), ("crashing", CRASHING_PER_MILLE),
                        ("slow", SLOW_PER_MILLE)):
        if n < share:
            return name
        n -= share
    return "ok"


DONE = frozenset({"done"})
ENDINGS = {
    "ok": DONE, "slow": DONE, "flaky": DONE,
    # Three attempts; the demo's one SIGKILL costs a job at most one more: DEMO_MAX_ATTEMPTS.
    "flaky_twice": DONE,
    "corrupt": frozenset({"failed(permanent)"}),
    # Crashes on every attempt; if the SIGKILL lands on its last one, that attempt's lease
    # runs out instead and it ends expired.
    "crashing": frozenset({"failed(exhausted)", "failed(expired)"}),
}
"""How each fate may end, whatever the timing: the endings the count accepts for it."""


def expected_endings(source: str) -> frozenset[str]:
    """The endings (``done``, ``failed(reason)``) this image's fetch job may have."""
    return ENDINGS[fate(source)]


def build_app(url: str | None, effects_path: str, prefix: str = "demo",
              crash: CrashPoint | None = None) -> App:
    """The demo app: queues ``{prefix}.fetch`` and ``{prefix}.thumbnail``; each handler passes
    ``crash`` (the worker processes' crash point) as it starts."""
    policy: dict[str, Any] = {"lease_s": DEMO_LEASE_S, "heartbeat_every_s": DEMO_HEARTBEAT_S,
                              "backoff_base_s": 0.2, "backoff_cap_s": 1.0,
                              "max_attempts": DEMO_MAX_ATTEMPTS}
    fetch_q, thumb_q = f"{prefix}.fetch", f"{prefix}.thumbnail"
    app = App(url, queues={fetch_q: policy, thumb_q: policy})
    effects = Effects(effects_path)
    crash_point = crash.reached if crash is not None else _nothing

    @app.task(queue=thumb_q, name="thumbnail")
    def thumbnail(source: str, width: int, job: Job) -> dict[str, Any]:
        crash_point()
        if fate(source) == "slow":
            time.sleep(SLOW_JOB_S)
        else:
            time.sleep(0.002)  # resize
        effects.apply(job, "thumbnail", source)
        return {"thumbnail": f"thumbs/{source}.{width}.webp"}

    @app.task(queue=fetch_q, name="fetch", permanent=(CorruptImage,))
    def fetch(source: str, size_kb: int, job: Job) -> Finish:
        crash_point()
        behaviour = fate(source)
        if (behaviour == "flaky" and job.attempt == 1) or (
                behaviour == "flaky_twice" and job.attempt <= 2):
            raise ConnectionError("upstream timed out")
        if behaviour == "corrupt":
            raise CorruptImage("JPEG header is damaged")
        if behaviour == "crashing":
            raise RuntimeError("decoder crashed")  # every time: ends exhausted
        time.sleep(0.003)  # download
        effects.apply(job, "download", source)
        return Finish(result={"bytes": size_kb * 1024},
                      then=[thumbnail.spec(source=source, width=256, job_id=f"thumb:{source}")])

    return app


def _nothing() -> None:
    return None
