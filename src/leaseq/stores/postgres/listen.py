"""The NOTIFY listener: one thread, one LISTEN connection per store, started by the first wait.

Enqueue sends ``pg_notify('leaseq_<schema>', queue)`` in its own transaction, so PostgreSQL
delivers it at commit (and never for a rolled-back job). The listener sets the store's wake-up
event when the queue is one a worker of this process has waited on. The set of watched queues
only grows: a notification that arrives between a worker's empty claim and its next wait must
still leave the event set, or that worker would sleep until its fallback poll.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg import sql

from leaseq.redact import redact
from leaseq.stores.watch import FinishWaiters

log = logging.getLogger(__name__)

#: How often the listening thread looks at its stop flag while no notification arrives.
POLL_S = 0.25
#: Longest pause between two attempts to get the LISTEN connection back.
MAX_PAUSE_S = 5.0
#: How often a caller waiting for the LISTEN to be in place looks whether its connection failed.
DOWN_CHECK_S = 0.02


class Listener:
    """Hears the NOTIFYs of one schema's channel and sets ``event`` for watched queues."""

    def __init__(self, conninfo: str, channel: str, event: threading.Event,
                 connect_kwargs: dict[str, Any] | None = None,
                 finish_channel: str | None = None):
        self._conninfo = conninfo
        #: Callers waiting on a job's finish, and the channel of the finishes' NOTIFYs. It is
        #: listened to only once a caller waits (``listen_finishes``): a worker's listener
        #: never receives the notification of every finished job.
        self.finishes = FinishWaiters()
        self._finish_channel = finish_channel
        self._want_finishes = False
        self._finishes_heard = threading.Event()
        self._channel = channel
        self._event = event
        self._connect_kwargs = connect_kwargs or {}
        self._watched: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self._listening = threading.Event()
        #: Set while the LISTEN connection is down (its last attempt failed): nobody waits
        #: for it then, the callers' fallback polls cover until it is back.
        self._down = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._connects = 0

    def watch(self, queues: Iterable[str], ready_timeout_s: float) -> bool:
        """Add ``queues`` to the watched set; start the thread on first use. True once LISTEN
        is in place (waits up to ``ready_timeout_s`` for it)."""
        with self._lock:
            self._watched = self._watched | frozenset(queues)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="leaseq-listen",
                                                daemon=True)
                self._thread.start()
        return self._ready(self._listening, ready_timeout_s)

    def listen_finishes(self, ready_timeout_s: float) -> bool:
        """Listen to the finish channel from now on; True once that LISTEN is in place
        (waits up to ``ready_timeout_s``: the thread takes it at its next poll)."""
        self._want_finishes = True
        self.watch((), ready_timeout_s=0)
        return self._ready(self._finishes_heard, ready_timeout_s)

    def _ready(self, listening: threading.Event, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for ``listening``; False at once while the connection is
        down (a refused connect, a pooler that cannot LISTEN): a wait then only delays its
        caller, whose own poll covers."""
        deadline = time.monotonic() + timeout_s
        while not self._down.is_set():
            left = deadline - time.monotonic()
            if listening.wait(min(max(left, 0.0), DOWN_CHECK_S)):
                return True
            if left <= 0:
                return False
        return listening.is_set()

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(POLL_S * 4)

    def _run(self) -> None:
        pause = 0.1
        while not self._stop.is_set():
            try:
                self._listen()
            except psycopg.Error as exc:
                self._listening.clear()
                self._finishes_heard.clear()
                self._down.set()
                if self._stop.is_set():
                    return
                log.warning("leaseq LISTEN connection lost (%s); retrying in %.1f s",
                            _first_line(exc), pause)
                self._stop.wait(pause)
                pause = min(pause * 2, MAX_PAUSE_S)

    def _listen(self) -> None:
        with psycopg.connect(self._conninfo, autocommit=True, **self._connect_kwargs) as conn:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
            if self._connects:
                # Notifications sent while the connection was down are lost: wake the
                # workers to look for themselves.
                self._event.set()
                self.finishes.wake_all()
            self._connects += 1
            self._down.clear()
            self._listening.set()
            while not self._stop.is_set():
                self._listen_finishes_if_wanted(conn)
                for note in conn.notifies(timeout=POLL_S):
                    if note.channel == self._finish_channel:
                        self.finishes.heard(note.payload)
                    elif note.payload in self._watched:
                        self._event.set()

    def _listen_finishes_if_wanted(self, conn: psycopg.Connection) -> None:
        if self._want_finishes and self._finish_channel and not self._finishes_heard.is_set():
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._finish_channel)))
            self._finishes_heard.set()


def _first_line(exc: BaseException) -> str:
    """The first line of the error's message, redacted (built-in: a store serves no app), or
    its type when it has none. psycopg's message may quote the connection that failed."""
    lines = str(exc).splitlines()
    return redact(lines[0]) if lines and lines[0] else type(exc).__name__
