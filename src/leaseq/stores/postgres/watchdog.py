"""The client-side deadline of every PostgreSQL call: a connection whose call outlives its
deadline is cut from this side.

Neither keepalives (they probe idle sockets) nor ``statement_timeout`` (it runs on a server
that may never have received the query) bound a call on a black-holed network. One thread per
store watches the calls in progress and, at a call's deadline, shuts its socket down
(``shutdown(2)`` on a duplicate of the descriptor): libpq's wait returns at once with a lost
connection, which the session handles like any other (retried when that is safe, else an
unknown outcome). Registering a call costs a dict insert under a lock; the thread sleeps until
the earliest deadline, and with no call in progress for ``horizon_s``: a call whose deadline is
the usual one (``call_timeout_s`` from its start, no shorter than the horizon) then never wakes
it, so a stream of short calls costs no thread switch each (one per call was about a tenth of
a single enqueue's client time). Only a shorter deadline (a caller's) wakes it early.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Protocol

log = logging.getLogger("leaseq.postgres")

#: The longest the thread sleeps at once (it then looks again): a wait for a far deadline
#: (``call_timeout_s=1e10``) would pass ``threading.TIMEOUT_MAX`` and kill the thread with
#: OverflowError, and with it every deadline of the store.
LONGEST_WAIT_S = min(3600.0, threading.TIMEOUT_MAX)


class _Connection(Protocol):
    def fileno(self) -> int: ...


class Watchdog:
    def __init__(self, name: str = "leaseq-pg-watchdog", horizon_s: float = 60.0):
        self._horizon_s = horizon_s
        self._calls: dict[int, tuple[float, _Connection]] = {}
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._wakes_at = float("inf")
        self._name = name
        self._thread: threading.Thread | None = None
        self._closed = False
        self.cuts = 0
        """Connections cut so far (read by tests and the chaos table)."""
        self.wakes = 0
        """Times the thread was woken early by a call (read by tests)."""

    @contextmanager
    def guard(self, conn: _Connection, deadline: float) -> Iterator[None]:
        """Cut ``conn`` should the block still run at ``deadline`` (monotonic)."""
        key = self.watch(conn, deadline)
        try:
            yield
        finally:
            self.release(key)

    def watch(self, conn: _Connection, deadline: float) -> int:
        """Cut ``conn`` at ``deadline`` (monotonic) unless ``release(key)`` comes first; the
        hot paths' form of ``guard``, which costs a generator."""
        key = next(self._ids)
        with self._cond:
            self._calls[key] = (deadline, conn)
            if self._thread is None:
                self._ensure_thread()
            if deadline < self._wakes_at:
                self.wakes += 1
                self._cond.notify()
        return key

    def release(self, key: int) -> None:
        with self._cond:
            self._calls.pop(key, None)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _ensure_thread(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                expired = [k for k, (at, _) in self._calls.items() if at <= now]
                for key in expired:
                    cut(self._calls.pop(key)[1])
                    self.cuts += 1
                self._wakes_at = min((at for at, _ in self._calls.values()),
                                     default=now + self._horizon_s)
                self._cond.wait(min(max(self._wakes_at - now, 0.001), LONGEST_WAIT_S))
                self._wakes_at = float("inf")


def cut(conn: _Connection) -> None:
    """Shut the connection's socket down without closing the descriptor libpq owns (also the
    async connections' cut: see aio.py's ``Call``)."""
    try:
        fd = os.dup(conn.fileno())
    except Exception:  # already closed: nothing left to cut
        return
    with suppress(OSError), socket.socket(fileno=fd) as sock:
        sock.shutdown(socket.SHUT_RDWR)
    log.warning("a PostgreSQL call outlived its deadline: its connection was cut")
