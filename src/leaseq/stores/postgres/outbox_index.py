"""The outbox's index on PostgreSQL, built where a dispatcher runs (``prepare_outbox``).

``jobs_outbox`` holds only the jobs still owed a publish, so the dispatcher's ``outbox_due``
walks those and not the published backlog. Without a broker every pending job would be in it,
one more index insert per enqueue and retry for nothing, so the schema does not carry it
(migration 012): the dispatcher builds it when it starts. Its definition and the statements
around it are named queries in ``queries/outbox.sql``.

The build is ``CREATE INDEX CONCURRENTLY`` (writes go on meanwhile), which leaves an INVALID
index behind when it fails or is cut; ``IF NOT EXISTS`` would keep that one for ever, so it is
dropped and built again. Dispatchers starting together build it once: the first takes a
session advisory lock per schema and the others poll for it (see ``try_lock_outbox_index`` for
why they never wait inside the server), then find the index valid.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress

import psycopg

log = logging.getLogger("leaseq.postgres")

#: Pause between two tries of the lock while another process builds the index.
LOCK_POLL_S = 0.2
#: Longest a stopping dispatcher waits to drop the index its cut-short build left.
STOP_DROP_S = 1.0


class Stopped(Exception):
    """``stop`` was set while waiting for another builder, or during the build (which was then
    cut short and dropped, as any build cut short)."""


def ensure_outbox_index(conn: psycopg.Connection, queries: Mapping[str, str],
                        lock_key: str, stop: threading.Event | None = None) -> bool:
    """Make ``jobs_outbox`` exist and be valid, over ``conn`` (in autocommit: a concurrent
    build refuses a transaction). Returns True when this call built it, False when it was
    there already (or another process built it meanwhile). A failed build raises the
    database's error, after dropping what it left where the connection still allows.
    ``stop``: set, it ends the wait and the build (``Stopped``): a dispatcher asked to stop
    does not wait for another process's build, nor for the transactions a build waits out."""
    if _valid(conn, queries):
        return False  # the usual start: one catalog read, no lock
    _lock(conn, queries, lock_key, stop)
    try:
        valid = _valid(conn, queries)  # under the lock: an INVALID one is no build in progress
        if valid:
            return False
        if valid is not None:
            conn.execute(queries["drop_outbox_index"])
        _build(conn, queries, stop)
        return True
    finally:
        with suppress(psycopg.Error):  # a lost connection released the lock already
            conn.execute(queries["unlock_outbox_index"], {"key": lock_key})


def _valid(conn: psycopg.Connection, queries: Mapping[str, str]) -> bool | None:
    """True: usable; False: left INVALID by a failed build; None: no such index."""
    row = conn.execute(queries["outbox_index_valid"]).fetchone()
    return None if row is None else bool(row[0])


def _lock(conn: psycopg.Connection, queries: Mapping[str, str], key: str,
          stop: threading.Event | None) -> None:
    """Take the builders' lock, polling: another process may be building for a while."""
    waited = False
    while not _taken(conn, queries, key):
        if not waited:
            log.info("waiting for another process to build the outbox index jobs_outbox")
            waited = True
        if stop is None:
            time.sleep(LOCK_POLL_S)
        elif stop.wait(LOCK_POLL_S):
            raise _stopped("while another process built the outbox index")


def _stopped(when: str) -> Stopped:
    log.info("stopped %s; the next start builds it", when)
    return Stopped(f"stopped {when}")


@contextmanager
def _cancelled_on(stop: threading.Event | None, conn: psycopg.Connection) -> Iterator[None]:
    """Cancel the statement ``conn`` runs in the block once ``stop`` is set (a thread of its
    own watches, as the statement holds the calling one)."""
    if stop is None:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.wait(LOCK_POLL_S):
            if stop.is_set():
                conn.cancel_safe()
                return

    watcher = threading.Thread(target=watch, name="leaseq-outbox-index-stop", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def _taken(conn: psycopg.Connection, queries: Mapping[str, str], key: str) -> bool:
    row = conn.execute(queries["try_lock_outbox_index"], {"key": key}).fetchone()
    return row is not None and bool(row[0])


def _build(conn: psycopg.Connection, queries: Mapping[str, str],
           stop: threading.Event | None) -> None:
    # No time limit of the role's or the URL's: the build blocks no reader or writer, and one
    # cut short is only dropped, to be started again from nothing at the next start.
    conn.execute("SET statement_timeout = 0")
    conn.execute("SET lock_timeout = 0")
    started = time.monotonic()
    try:
        with _cancelled_on(stop, conn):
            conn.execute(queries["create_outbox_index"])
    except psycopg.Error:
        stopping = stop is not None and stop.is_set()
        # Not left for the next start: an INVALID index that is already "ready" is written
        # by every insert and read by no query. The drop too waits for the transactions
        # older than it; a stopping dispatcher gives it STOP_DROP_S and leaves the rest to
        # the next start (which drops an INVALID index before it builds).
        with suppress(psycopg.Error):
            if stopping:
                conn.execute(f"SET statement_timeout = {int(STOP_DROP_S * 1000)}")
            conn.execute(queries["drop_outbox_index"])
        if stopping:
            raise _stopped("during the build of the outbox index") from None
        raise
    log.info("built the outbox index jobs_outbox in %.1f s", time.monotonic() - started)
