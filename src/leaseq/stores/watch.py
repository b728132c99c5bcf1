"""Wake-ups for a caller waiting on one job's finish (``Queue.wait``, ``Queue.await_result``).

A watch is made *before* the caller's first read of the job, so a finish that lands between
that read and the wait still wakes it. Every wake-up is a hint, never a verdict: the caller
reads the job again. Three kinds, one per store family:

* ``FinishWatch``: polling every ``poll_s`` (MongoDB; any store without change signals).
* ``ChangeCounterWatch``: SQLite's ``PRAGMA data_version`` read on a connection of its own,
  which therefore sees every commit, this process's included; a read costs microseconds (the
  same signal the SQLite store's idle workers wait on) and never waits for a lock.
* ``NotifyWatch``: PostgreSQL's NOTIFY on the job's finish (a statement trigger sends it at commit),
  heard by the store's one LISTEN connection and handed to the waiters by ``FinishWaiters``.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import suppress

from leaseq.errors import StoreUnavailable

#: How often a polling watch wakes its waiter. Defaults to 100 ms.
FINISH_POLL_S = 0.1
#: How often a SQLite watch reads the change counter. Defaults to 5 ms.
COUNTER_POLL_S = 0.005
#: Longest a notified watch sleeps without a notification: covers a NOTIFY lost while the
#: LISTEN connection was down. Defaults to 1 s.
NOTIFY_FALLBACK_S = 1.0


def finish_key(queue: str, job_id: str) -> str:
    """A job's key in a finish NOTIFY (``009_finish_notify_per_statement.sql`` computes the
    same): a fixed-size digest, since a job id may be longer than a NOTIFY payload may be."""
    return hashlib.md5(f"{queue}/{job_id}".encode(), usedforsecurity=False).hexdigest()


class FinishWatch:
    """Polls: each wait sleeps ``poll_s`` (or less, up to the timeout)."""

    poll_s = FINISH_POLL_S

    def wait(self, timeout_s: float) -> None:
        time.sleep(max(min(timeout_s, self.poll_s), 0.0))

    async def await_(self, timeout_s: float) -> None:
        await asyncio.sleep(max(min(timeout_s, self.poll_s), 0.0))

    def close(self) -> None:
        """Release what the watch holds (nothing for a polling one)."""

    def __enter__(self) -> FinishWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ChangeCounterWatch(FinishWatch):
    """Wakes when any connection commits to the SQLite database file.

    Its reads never wait (busy timeout 0): ``await_`` reads on the event loop, and in
    rollback-journal mode (no WAL: a Django alias without it, a file system WAL cannot run
    on) another connection's write lock blocks every reader, for as long as that writer
    likes. A read refused for a lock counts as a change: the caller then reads the job
    again, off the loop, where the store's own busy timeout does the waiting. Any other
    refusal is ``StoreUnavailable``."""

    poll_s = COUNTER_POLL_S

    def __init__(self, path: str):
        self._path = path
        try:
            self._conn = sqlite3.connect(path, timeout=0, isolation_level=None,
                                         check_same_thread=False)
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from None
        try:
            self._seen = self._version()
        except BaseException:
            self._conn.close()
            raise

    def _version(self) -> int | None:
        """The change counter, or None while another connection's lock keeps it unread."""
        try:
            return int(self._conn.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                return None
            raise self._unavailable(exc) from None
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from None

    def _unavailable(self, exc: sqlite3.Error) -> StoreUnavailable:
        return StoreUnavailable(f"SQLite database {self._path!r}: its change counter could "
                                f"not be read: {exc}")

    def _changed(self) -> bool:
        """True when a commit landed since the last read, or may have (the read was locked
        out, or the one before it was)."""
        version = self._version()
        changed = version is None or version != self._seen
        self._seen = version
        return changed

    def wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._changed() and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, self.poll_s))

    async def await_(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._changed() and (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(left, self.poll_s))

    def close(self) -> None:
        self._conn.close()


class FinishWaiters:
    """Who waits on which finish key: the LISTEN thread calls ``heard`` with each payload."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, set[Callable[[], None]]] = {}

    def add(self, key: str, wake: Callable[[], None]) -> None:
        with self._lock:
            self._by_key.setdefault(key, set()).add(wake)

    def remove(self, key: str, wake: Callable[[], None]) -> None:
        with self._lock:
            wakes = self._by_key.get(key)
            if wakes is not None:
                wakes.discard(wake)
                if not wakes:
                    del self._by_key[key]

    def heard(self, payload: str) -> None:
        """A finish NOTIFY: the keys of the jobs one statement finished, space-separated."""
        with self._lock:
            if not self._by_key:
                return
            wakes = [w for key in payload.split() for w in self._by_key.get(key, ())]
        for wake in wakes:
            wake()

    def wake_all(self) -> None:
        """After a reconnect of the LISTEN connection: notifications may have been lost."""
        with self._lock:
            wakes = [w for ws in self._by_key.values() for w in ws]
        for wake in wakes:
            wake()


class NotifyWatch(FinishWatch):
    """Wakes on the job's finish NOTIFY, or after ``NOTIFY_FALLBACK_S`` at the latest."""

    poll_s = NOTIFY_FALLBACK_S

    def __init__(self, waiters: FinishWaiters, key: str):
        self._waiters = waiters
        self._key = key
        self._flag = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async_flag: asyncio.Event | None = None
        waiters.add(key, self._wake)

    def _wake(self) -> None:
        self._flag.set()
        loop, flag = self._loop, self._async_flag
        if loop is not None and flag is not None:
            with suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
                loop.call_soon_threadsafe(flag.set)

    def wait(self, timeout_s: float) -> None:
        self._flag.wait(max(min(timeout_s, self.poll_s), 0.0))
        self._flag.clear()

    async def await_(self, timeout_s: float) -> None:
        if self._async_flag is None:
            self._async_flag = asyncio.Event()
            self._loop = asyncio.get_running_loop()
            if self._flag.is_set():
                self._async_flag.set()
        with suppress(TimeoutError):
            await asyncio.wait_for(self._async_flag.wait(),
                                   max(min(timeout_s, self.poll_s), 0.0))
        self._async_flag.clear()
        self._flag.clear()

    def close(self) -> None:
        self._waiters.remove(self._key, self._wake)
