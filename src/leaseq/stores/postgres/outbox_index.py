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
import time
from collections.abc import Mapping
from contextlib import suppress

import psycopg

log = logging.getLogger("leaseq.postgres")

#: Pause between two tries of the lock while another process builds the index.
LOCK_POLL_S = 0.2


def ensure_outbox_index(conn: psycopg.Connection, queries: Mapping[str, str],
                        lock_key: str) -> bool:
    """Make ``jobs_outbox`` exist and be valid, over ``conn`` (in autocommit: a concurrent
    build refuses a transaction). Returns True when this call built it, False when it was
    there already (or another process built it meanwhile). A failed build raises the
    database's error, after dropping what it left where the connection still allows."""
    if _valid(conn, queries):
        return False  # the usual start: one catalog read, no lock
    _lock(conn, queries, lock_key)
    try:
        valid = _valid(conn, queries)  # under the lock: an INVALID one is no build in progress
        if valid:
            return False
        if valid is not None:
            conn.execute(queries["drop_outbox_index"])
        _build(conn, queries)
        return True
    finally:
        with suppress(psycopg.Error):  # a lost connection released the lock already
            conn.execute(queries["unlock_outbox_index"], {"key": lock_key})


def _valid(conn: psycopg.Connection, queries: Mapping[str, str]) -> bool | None:
    """True: usable; False: left INVALID by a failed build; None: no such index."""
    row = conn.execute(queries["outbox_index_valid"]).fetchone()
    return None if row is None else bool(row[0])


def _lock(conn: psycopg.Connection, queries: Mapping[str, str], key: str) -> None:
    """Take the builders' lock, polling: another process may be building for a while."""
    waited = False
    while not _taken(conn, queries, key):
        if not waited:
            log.info("waiting for another process to build the outbox index jobs_outbox")
            waited = True
        time.sleep(LOCK_POLL_S)


def _taken(conn: psycopg.Connection, queries: Mapping[str, str], key: str) -> bool:
    row = conn.execute(queries["try_lock_outbox_index"], {"key": key}).fetchone()
    return row is not None and bool(row[0])


def _build(conn: psycopg.Connection, queries: Mapping[str, str]) -> None:
    # No time limit of the role's or the URL's: the build blocks no reader or writer, and one
    # cut short is only dropped, to be started again from nothing at the next start.
    conn.execute("SET statement_timeout = 0")
    conn.execute("SET lock_timeout = 0")
    started = time.monotonic()
    try:
        conn.execute(queries["create_outbox_index"])
    except psycopg.Error:
        # Not left for the next start: an INVALID index that is already "ready" is written
        # by every insert and read by no query.
        with suppress(psycopg.Error):
            conn.execute(queries["drop_outbox_index"])
        raise
    log.info("built the outbox index jobs_outbox in %.1f s", time.monotonic() - started)
