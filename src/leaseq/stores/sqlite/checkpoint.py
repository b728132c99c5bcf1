"""The WAL checkpoints of a SQLite store, taken off its commits.

In WAL mode a commit appends pages to the ``-wal`` file; a checkpoint copies them back into
the database file and syncs it. By default SQLite checkpoints inside the commit that takes the
WAL past ``wal_autocheckpoint`` pages: that claim or finish, holding the store's lock, waits
while the pages are written and the file is synced, and so does every thread behind it. The
bigger the database, the more distinct pages a checkpoint writes (a million-job backlog spreads
a batch's journal entries over as many pages), so the drain of a large backlog slowed by a
third, in bursts.

A ``Checkpointer`` takes passive checkpoints every ``CHECKPOINT_EVERY_S`` on a connection and a
thread of its own. SQLite's checkpoints run beside commits (a writer appends to the WAL while
the checkpoint copies earlier frames; readers never wait), and the sqlite3 module releases the
GIL while SQLite works. The store's own connection keeps a backstop, ``BACKSTOP_PAGES``: if this
thread is gone or cannot keep up, a commit checkpoints as it would by default. Durability is
SQLite's either way: a checkpoint moves committed pages, it commits nothing.
"""

from __future__ import annotations

import logging
import sqlite3
import threading

from leaseq.job import safe_reason

log = logging.getLogger(__name__)

#: How often the thread checkpoints the WAL. A passive checkpoint with nothing to copy costs
#: microseconds; one with frames to copy writes them and syncs the database file once.
CHECKPOINT_EVERY_S = 0.05
#: The store connection's own ``wal_autocheckpoint``, reached only when the thread falls
#: behind by this many pages (16 MiB at 4 KiB pages; SQLite's default is 1,000).
BACKSTOP_PAGES = 4_000


class Checkpointer:
    """Passive WAL checkpoints of the database at ``path``, from a daemon thread, until
    ``stop()``."""

    def __init__(self, path: str, every_s: float = CHECKPOINT_EVERY_S):
        self.path = path
        self.every_s = every_s
        #: What the last checkpoint returned: (busy, frames in the WAL, frames copied).
        self.last: tuple[int, int, int] | None = None
        self._stopped = threading.Event()
        # Opened here, by the caller, so the path means what it meant to the store (the
        # thread could start after a change of working directory).
        try:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            log.warning("WAL checkpoints of %s stay on the commits: %s", path,
                        safe_reason(exc))
            conn = None
        self._thread = threading.Thread(target=self._run, args=(conn,), daemon=True,
                                         name=f"leaseq-checkpoint {path}")
        if conn is not None:
            self._thread.start()

    def stop(self) -> None:
        """End the thread after the checkpoint under way, if any."""
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self, conn: sqlite3.Connection) -> None:
        try:
            while not self._stopped.wait(self.every_s):
                # PASSIVE never waits for readers or writers (nor calls the busy handler): it
                # copies what it can and leaves the rest for the next turn.
                self.last = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:  # the database went away, or its disk failed
            log.warning("WAL checkpoints of %s back on the commits: %s", self.path,
                        safe_reason(exc))
        finally:
            conn.close()
