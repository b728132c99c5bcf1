"""How long the SQLite store waits for others: never past the caller's deadline.

A store call made inside ``leaseq.deadline.within`` (a heartbeat, a shutdown's give-back, the
worker registry's beat) must end in time, or the worker's lease clock cannot run while the
database lease lapses. A SQLite call waits in two places: for the store's one lock in this
process (another thread's transaction), and for the database's write lock (another process's
``BEGIN IMMEDIATE``, up to ``busy_timeout_ms``). Both waits are cut to what the deadline leaves.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from leaseq import deadline
from leaseq.errors import StoreUnavailable


class StoreLock:
    """The store's lock (re-entrant, one per store), taken within the caller's deadline."""

    def __init__(self, path: str):
        self._lock = threading.RLock()
        self._path = path

    def __enter__(self) -> None:
        left = deadline.remaining_s()
        if not self._lock.acquire(timeout=-1 if left is None else left):
            raise StoreUnavailable(f"SQLite database {self._path!r}: another call in this "
                                   "process held the store past the caller's deadline")

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


@contextmanager
def busy_within_deadline(conn: sqlite3.Connection) -> Iterator[None]:
    """The connection's busy wait (``PRAGMA busy_timeout``) cut to the caller's deadline for
    the block, and set back after it."""
    left = deadline.remaining_s()
    if left is None:
        yield
        return
    before = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])
    conn.execute(f"PRAGMA busy_timeout = {min(before, int(left * 1000))}")
    try:
        yield
    finally:
        conn.execute(f"PRAGMA busy_timeout = {before}")
