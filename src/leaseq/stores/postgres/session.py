"""Connections of the PostgreSQL store: the pool, transactions, and riding out a lost server.

``run(work)`` runs ``work(conn)`` in one transaction and commits. When the connection is lost
(a restart, a failover) or the server rolls the transaction back (deadlock, serialization
failure), ``work`` is run again on a fresh connection, with backoff, for up to ``reconnect_s``;
then ``StoreUnavailable``. That is safe because the failed transaction was rolled back. The one
unsafe case is a connection lost *during* COMMIT: the write may or may not have happened. Only
callers that pass ``idempotent=True`` (reads, claims, heartbeats: doing them twice is
harmless) are retried then; the others get ``StoreUnavailable`` saying the outcome is unknown.
A claim is safe to run twice only if its first run is found again: it passes ``read_back``, and
the next try first ends the lost try's server session (``_settle``: a statement still running
there must not commit after it is looked for; only on a connection straight to the server,
never through a pooler, which hands the session to another client), then asks ``read_back``
what it committed.

``run(work, autocommit=True)`` is for work that is one statement: pool connections are in
autocommit, so the statement is its own transaction and costs one round trip instead of three
(BEGIN, statement, COMMIT). Its send is also its COMMIT, so a connection lost under it leaves
the outcome unknown, exactly as above, unless the server answered with an error (it aborted the
statement). Connections that died while idle in the pool (a restart) are found without a round
trip when checked out (see ``_dead``) and replaced at once: no retry, no unknown outcome.

Nothing waits without a bound: each try has a client-side deadline (``call_timeout_s``, or the
caller's shorter ``leaseq.deadline``) after which the ``Watchdog`` cuts its connection, and the
tries together stop at ``reconnect_s`` or the caller's deadline, whichever comes first.
"""

from __future__ import annotations

import functools
import os
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, NoReturn, Protocol, TypeVar
from urllib.parse import urlsplit

import psycopg
from psycopg.rows import tuple_row
from psycopg_pool import ConnectionPool, PoolClosed

from leaseq import deadline as caller_deadline
from leaseq.errors import InvalidInput, InvalidURL, LeaseqError, StoreRefused, StoreUnavailable
from leaseq.stores.postgres.options import PostgresOptions
from leaseq.stores.postgres.watchdog import Watchdog
from leaseq.validate import redact_url

T = TypeVar("T")


class Sessions(Protocol):
    """What the store's code may ask of its session: ``Session`` here, the Django store's
    ``DjangoSession`` on Django's connections. Typed so that mypy catches a call only one of
    them answers."""

    url: str

    def first_use(self, work: Callable[[psycopg.Connection], object]) -> None: ...

    def close(self) -> None: ...

    def run(self, work: Callable[[psycopg.Connection], T], *, idempotent: bool = False,
            autocommit: bool = False, generic_plans: bool = False,
            read_back: Callable[[psycopg.Connection], T | None] | None = None) -> T: ...

    def error_line(self, exc: BaseException) -> str: ...


#: First and longest pause between two tries of an operation whose connection was lost.
FIRST_PAUSE_S = 0.05
MAX_PAUSE_S = 1.0


#: How often ``_settle`` looks whether a lost try's server session has ended.
SETTLE_POLL_S = 0.01


class _Retry(Exception):
    """The transaction surely did not commit, or its outcome will be read back: the operation
    may run again."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


@dataclass(frozen=True)
class Backend:
    """A server session, told apart from a later one given the same process id."""

    pid: int
    started: datetime


@dataclass
class _Run(Generic[T]):
    """One ``run``: what it may do again, and a lost try whose outcome is still unknown
    (``unsettled``), with its server session when that is known to be the try's alone."""

    work: Callable[[psycopg.Connection], T]
    idempotent: bool
    autocommit: bool
    read_back: Callable[[psycopg.Connection], T | None] | None
    deadline: float
    unsettled: bool = False
    lost_backend: Backend | None = None
    started: float = field(default_factory=time.monotonic)


class Session:
    """The pool of one store, and ``run``: one transaction, retried across reconnects."""

    def __init__(self, conninfo: str, url: str, options: PostgresOptions):
        self.url = redact_url(url)
        self._conninfo = conninfo
        self._password = _password(url)
        self._options = options
        self._pool: ConnectionPool | None = None
        self._generic_pool: ConnectionPool | None = None
        self._generic_lock = threading.Lock()
        self._closed = False
        self.watchdog = Watchdog(f"leaseq-pg-watchdog-{options.schema}",
                                 horizon_s=options.call_timeout_s)
        self._checking = False
        self._checking_lock = threading.Lock()

    def first_use(self, work: Callable[[psycopg.Connection], object]) -> None:
        """Run ``work`` (the migration) over a direct connection, then open the pool.

        A direct connection fails at once with libpq's own message (refused, unknown host,
        bad password), where a pool would only time out. It has the pool's session settings
        before its first statement: under a database's default of REPEATABLE READ the
        migration's snapshot would predate the migration lock it waits for, and it would
        apply again what the lock's holder had just applied.

        A server that is restarting (shutting down, starting up, or ending the session under
        the migration: ``restarting``) is waited out for ``reconnect_s``, as every later call
        rides out a restart; from then on a refused connection is the restart's gap, waited
        out too. The migration's transaction was rolled back with its session, and it runs
        under its lock, so trying it again is safe."""
        deadline = time.monotonic() + self._options.reconnect_s
        pause = FIRST_PAUSE_S
        while True:
            try:
                return self._first_use_once(work)
            except StoreUnavailable as exc:
                cause = exc.__context__
                if not isinstance(cause, psycopg.OperationalError) or not (
                        restarting(cause) or pause > FIRST_PAUSE_S):
                    raise
                if self._closed or time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, MAX_PAUSE_S)

    def _first_use_once(self, work: Callable[[psycopg.Connection], object]) -> None:
        conn = self._connect_directly()
        with conn:
            try:
                conn.execute(session_settings(self._options))
                with conn.transaction():  # autocommit: the settings outlive it, work does not
                    work(conn)
            except psycopg.OperationalError as exc:
                raise StoreUnavailable(
                    f"cannot connect to PostgreSQL at {self.url}: {self.error_line(exc)}"
                ) from None
            except psycopg.errors.InsufficientPrivilege as exc:  # the URL's role may not read
                raise InvalidURL(
                    f"PostgreSQL URL {self.url} was refused: {self.error_line(exc)}") from None
            except psycopg.Error as exc:  # a DDL that failed, a read-only server
                raise StoreUnavailable(
                    f"cannot create or upgrade the leaseq store at {self.url}; nothing was "
                    f"changed: {self.why(exc)}") from None
        self._open_pool()

    def _connect_directly(self) -> psycopg.Connection:
        """A connection of its own to the server, in autocommit. libpq refusing the URL's
        options (a keyword it does not know, or a value it does not take) is ``InvalidURL``;
        no server, or no entry, is ``StoreUnavailable``."""
        try:
            return psycopg.connect(self._conninfo, autocommit=True)
        except psycopg.OperationalError as exc:
            if _refused_option(exc):
                raise InvalidURL(
                    f"PostgreSQL URL {self.url} was refused: {self.error_line(exc)}") from None
            raise StoreUnavailable(
                f"cannot connect to PostgreSQL at {self.url}: {self.error_line(exc)}") from None
        except psycopg.ProgrammingError as exc:
            raise InvalidURL(
                f"PostgreSQL URL {self.url} was refused: {self.error_line(exc)}") from None

    def _open_pool(self) -> None:
        options = self._options
        self._pool = ConnectionPool(
            self._conninfo, min_size=options.pool_min, max_size=options.pool_max,
            configure=functools.partial(_configure, options=options),
            kwargs={"autocommit": True}, open=True,
            name=f"leaseq-{options.schema}", timeout=max(options.reconnect_s, 1.0))

    def close(self) -> None:
        self.watchdog.close()
        with self._generic_lock:
            self._closed = True
            pools, self._generic_pool = [self._pool, self._generic_pool], None
        for pool in pools:
            if pool is not None:
                pool.close()

    def run(self, work: Callable[[psycopg.Connection], T], *, idempotent: bool = False,
            autocommit: bool = False, generic_plans: bool = False,
            read_back: Callable[[psycopg.Connection], T | None] | None = None) -> T:
        """``work(conn)`` in one transaction, committed; see the module's docstring.
        ``autocommit``: ``work`` runs one statement, which is its own transaction.
        ``idempotent``: running ``work`` twice is harmless, so it is run again even when the
        connection was lost during its COMMIT. ``read_back``: after such a loss, what the lost
        try committed (its result), or None when it committed nothing; ``work`` runs again
        only then. ``generic_plans``: on a connection of the second pool, whose prepared
        statements are planned once (see ``_configure``): only for statements that scan
        nothing."""
        deadline = time.monotonic() + self._options.reconnect_s
        callers = caller_deadline.current()
        if callers is not None:
            deadline = min(deadline, callers)
        this = _Run(work, idempotent or read_back is not None, autocommit, read_back, deadline)
        pause = FIRST_PAUSE_S
        while True:
            try:
                return self._attempt(this, generic_plans)
            except psycopg.Error as exc:
                typed = typed_refusal(exc, self.url, self.error_line(exc))
                if typed is not None:
                    raise typed from None
                raise
            except _Retry as exc:
                if time.monotonic() + pause > deadline:
                    raise self._gave_up(this, callers, exc) from None
                time.sleep(pause)
                pause = min(pause * 2, MAX_PAUSE_S)

    def _gave_up(self, this: _Run[T], callers: float | None, exc: _Retry) -> StoreUnavailable:
        """The error of a run out of time. A lost try it could not settle may still commit:
        its server session is ended in the background (``_settle_soon``), and the error says
        the outcome is unknown."""
        unknown = ""
        if this.unsettled:
            unknown = "; the outcome of a try cut off while it committed is unknown"
            if this.lost_backend is not None:
                self._settle_soon(this.lost_backend)
        return StoreUnavailable(
            f"PostgreSQL at {self.url} is unavailable (gave up after "
            f"{self._gave_up_after(this, callers)}){unknown}: {self.why(exc.cause)}")

    def why(self, cause: BaseException) -> str:
        return why(cause, self.error_line(cause))

    def _settle_soon(self, lost: Backend) -> None:
        """End a lost try's server session from a thread of its own, within ``reconnect_s``:
        its caller has given up, but a statement still running there (stalled, or waiting for
        a row lock) would otherwise commit later, its jobs held for nobody."""
        def settle() -> None:
            until = time.monotonic() + self._options.reconnect_s
            with suppress(Exception):  # best effort: the server may still be away
                self.run(lambda conn: self._settle(conn, lost, until), autocommit=True,
                         idempotent=True)

        threading.Thread(target=settle, name="leaseq-pg-settle", daemon=True).start()

    def _gave_up_after(self, this: _Run[T], callers: float | None) -> str:
        """The caller's deadline, or how long the tries took: ``reconnect_s``, or longer
        when a try was cut at ``call_timeout_s`` past it."""
        if callers is not None and callers < this.started + self._options.reconnect_s:
            return "the caller's deadline"
        return f"{time.monotonic() - this.started:.1f} s"

    def _call_deadline(self) -> float:
        """When this try's connection is cut: ``call_timeout_s`` from now, or the caller's
        deadline when that comes first."""
        at = time.monotonic() + self._options.call_timeout_s
        callers = caller_deadline.current()
        return at if callers is None else min(at, callers)

    def _attempt(self, this: _Run[T], generic_plans: bool) -> T:
        pool = (self._generic_pool or self._generic()) if generic_plans else self._pool
        if pool is None:
            raise StoreUnavailable(f"PostgreSQL store {self.url} is not open")
        conn = self._live_connection(pool, this)
        try:
            cut_at = self._call_deadline()
            setattr(conn, _CUT_AT, cut_at)
            watched = self.watchdog.watch(conn, cut_at)
            try:
                if this.unsettled:
                    found = self._read_back(conn, this)
                    if found is not None:
                        return found
                if this.autocommit:
                    return self._statement(conn, this)
                return self._transaction(conn, this)
            finally:
                self.watchdog.release(watched)
        finally:
            pool.putconn(conn)

    def _live_connection(self, pool: ConnectionPool, this: _Run[T]) -> psycopg.Connection:
        """A connection of ``pool`` the server has not closed. One it has (``_dead``: found
        without a round trip, nothing sent on it) is put back to be replaced and the next
        is taken at once: after a restart every idle connection is dead, and each would
        otherwise cost a retry's pause. ``_Retry`` when the pool has none in time, or only
        dead ones."""
        for _ in range(pool.max_size + 1):
            try:
                conn = pool.getconn(timeout=max(this.deadline - time.monotonic(), 0.05))
            except PoolClosed:
                raise StoreUnavailable(f"PostgreSQL store {self.url} is closed") from None
            except psycopg.OperationalError as exc:  # PoolTimeout: none came back in time
                raise _Retry(exc) from None
            if not _dead(conn):
                return conn
            self._after_error(conn)
            pool.putconn(conn)
        raise _Retry(psycopg.OperationalError("the server closed the connection"))

    def _read_back(self, conn: psycopg.Connection, this: _Run[T]) -> T | None:
        """After a try lost with its outcome unknown: end that try's server session, then
        read back what it committed (None: nothing, so ``work`` runs again)."""
        assert this.read_back is not None
        with self._uncommitted(conn):
            if this.lost_backend is not None:
                self._settle(conn, this.lost_backend, this.deadline)
            found = this.read_back(conn)
        this.unsettled, this.lost_backend = False, None
        return found

    def _settle(self, conn: psycopg.Connection, lost: Backend, deadline: float) -> None:
        """End the server session of a lost try and wait until it is gone: a statement it was
        still running (waiting on a lock, or its answer not yet sent) then has committed or
        never will. Its own role may end it; if the server refuses, it is awaited (the server
        ends a session whose client has gone at its next read or write)."""
        who = {"pid": lost.pid, "started": lost.started}
        with suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE pid = %(pid)s AND backend_start = %(started)s", who)
        while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %(pid)s "
                           "AND backend_start = %(started)s", who).fetchone():
            if time.monotonic() + SETTLE_POLL_S > deadline:
                raise _Retry(psycopg.OperationalError(
                    "the server session of a lost try has not ended"))
            time.sleep(SETTLE_POLL_S)

    def _generic(self) -> ConnectionPool | None:
        """The second pool, opened on first use (most processes never enqueue one by one)."""
        with self._generic_lock:
            if self._generic_pool is None and self._pool is not None and not self._closed:
                options = self._options
                self._generic_pool = ConnectionPool(
                    self._conninfo, min_size=1, max_size=options.pool_max,
                    configure=functools.partial(_configure_session, options=options),
                    kwargs={"autocommit": True}, open=True,
                    name=f"leaseq-{options.schema}-generic",
                    timeout=max(options.reconnect_s, 1.0))
            return self._generic_pool

    def _statement(self, conn: psycopg.Connection, this: _Run[T]) -> T:
        try:
            return this.work(conn)
        except psycopg.Error as exc:
            if not retryable(conn, exc):
                self._after_error(conn, exc)
                raise
            # An error the server reported (deadlock, shutdown) aborted the statement; a bare
            # lost connection may have cut off the answer to a statement that committed.
            self._lost(conn, exc, this, unknown=exc.sqlstate is None)
        except BaseException:
            self._after_error(conn)
            raise

    def _transaction(self, conn: psycopg.Connection, this: _Run[T]) -> T:
        with self._uncommitted(conn):
            conn.execute("BEGIN")
            result = this.work(conn)
        try:
            conn.execute("COMMIT")
        except psycopg.Error as exc:
            if not retryable(conn, exc):
                self._after_error(conn, exc)
                raise
            self._lost(conn, exc, this, unknown=True)
        return result

    @contextmanager
    def _uncommitted(self, conn: psycopg.Connection) -> Iterator[None]:
        """Work that commits nothing: a driver error in it (the connection lost, the server's
        refusal) may be retried; any error leaves the connection clean for the pool."""
        try:
            yield
        except psycopg.Error as exc:
            retry = retryable(conn, exc)
            self._after_error(conn, exc)
            if not retry:
                raise
            raise _Retry(exc) from None
        except BaseException:
            self._after_error(conn)
            raise

    def _lost(self, conn: psycopg.Connection, exc: psycopg.Error, this: _Run[T],
              unknown: bool) -> NoReturn:
        """After a statement or a COMMIT failed: retry, or raise that the outcome is unknown.
        ``unknown``: the server did not say it rolled back; it did if the connection is not
        lost (it refused)."""
        lost = conn.broken
        backend = getattr(conn, _BACKEND, None)
        self._after_error(conn, exc)
        if not (unknown and lost):
            raise _Retry(exc) from None
        if this.read_back is not None:
            this.unsettled, this.lost_backend = True, backend
            raise _Retry(exc) from None
        if this.idempotent:
            raise _Retry(exc) from None
        raise StoreUnavailable(
            f"lost the connection to PostgreSQL at {self.url} while committing; the "
            f"outcome is unknown: {self.error_line(exc)}") from None

    def _after_error(self, conn: psycopg.Connection, exc: BaseException | None = None) -> None:
        """Leave ``conn`` fit for the pool: rolled back, or closed (the pool replaces it) when
        it is lost, or when it must not be used again (``discard_connection``)."""
        if exc is not None and discard_connection(exc):
            conn.close()
            return
        if conn.broken or conn.closed:
            self._check_pools_soon()
            return
        with suppress(psycopg.Error):
            conn.rollback()

    def _check_pools_soon(self) -> None:
        """After a server restart every idle connection in the pool is dead too: test them
        rather than fail once per connection. In a thread of its own: each test is a round
        trip, which on a cut-off network must not hold up the caller past its deadline."""
        with self._checking_lock:
            if self._checking:
                return
            self._checking = True
        threading.Thread(target=self._check_pools, name="leaseq-pg-check", daemon=True).start()

    def _check_pools(self) -> None:
        try:
            for pool in (self._pool, self._generic_pool):
                if pool is not None:
                    with suppress(Exception):  # closed meanwhile, or the server is still away
                        pool.check()
        finally:
            with self._checking_lock:
                self._checking = False

    def error_line(self, exc: BaseException) -> str:
        """The first line of a driver error, with the password masked should it appear."""
        return error_line(exc, self._password)


def error_line(exc: BaseException, password: str | None) -> str:
    """The first line of a driver error (at most 300 characters), with ``password`` masked
    should it appear."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if password:
        text = text.replace(password, "***")
    return text[:300]


def _configure(conn: psycopg.Connection, options: PostgresOptions) -> None:
    """Timestamps come back in UTC whatever the server's or role's time zone; a session cut off
    inside a transaction is ended by the server (``idle_in_transaction_s``).

    Prepared statements (the hot ones, and any psycopg prepares after five runs) keep their
    parse but are planned on every run: a generic plan is made once, often while the table is
    young (an idle worker's empty claims), and a sequential scan chosen on a few rows would
    then be kept while the queue grows — measured: a claim 60x slower until autovacuum's
    next ANALYZE. Planning costs ~0.1-0.4 ms per statement, spread over a whole batch."""
    _configure_session(conn, options)
    conn.execute("SET plan_cache_mode = force_custom_plan")


def _configure_session(conn: psycopg.Connection, options: PostgresOptions) -> None:
    """The session's settings, and which server session it is (``Backend``, for ``_settle``),
    in one round trip."""
    row = conn.execute(
        "SELECT pid, backend_start, client_port, current_setting('port')::integer "
        "FROM pg_stat_activity WHERE pid = pg_backend_pid(); "
        f"{session_settings(options)}").fetchone()
    # The start time is hidden from a session whose role was switched (options=-c role=…):
    # without it the session cannot be told from a later one given its process id.
    if row is not None and row[1] is not None and _direct(conn, row[2], row[3]):
        setattr(conn, _BACKEND, Backend(row[0], row[1]))
    setattr(conn, _TUPLE_CURSOR, conn.cursor(row_factory=tuple_row))


def session_settings(options: PostgresOptions) -> str:
    """The settings every leaseq connection starts with, blocking or async, as one simple
    query (one round trip): UTC, the server's end to a session idle in a transaction, and
    READ COMMITTED whatever the server, database or role default: a limited claim's snapshot
    must be taken after it holds the queue's limits lock (queries/limits.sql), which under
    REPEATABLE READ it is not (its first statement, the lock, takes it), and the counts it
    read would miss what the lock's last holder claimed."""
    milliseconds = max(int(options.idle_in_transaction_s * 1000), 1)
    return (f"SET TIME ZONE 'UTC'; SET idle_in_transaction_session_timeout = {milliseconds}; "
            "SET default_transaction_isolation = 'read committed'")


#: The attribute of a leaseq connection that holds its tuple cursor (``tuple_cursor``).
_TUPLE_CURSOR = "_leaseq_tuple_cursor"
#: The attribute of a leaseq pool connection that holds its server session (``Backend``).
_BACKEND = "_leaseq_backend"
#: The attribute of a leaseq pool connection that holds when its present try is cut.
_CUT_AT = "_leaseq_cut_at"
#: How long before a try is cut the server stops waiting for a lock (``lock_timeout``).
LOCK_WAIT_MARGIN_S = 0.1
#: The longest ``lock_timeout`` PostgreSQL accepts (a ``call_timeout_s`` may be longer).
MAX_LOCK_TIMEOUT_MS = 2**31 - 1


def lock_timeout(conn: psycopg.Connection) -> str | None:
    """``SET LOCAL lock_timeout`` for the present try on ``conn``: the server stops waiting
    for a lock just before the client cuts the try. Else a claim still waiting when its
    caller gave up would take the lock and commit: its jobs held by a worker that never got
    them. None on a connection that is not cut (a caller's own)."""
    cut_at = getattr(conn, _CUT_AT, None)
    if cut_at is None:
        return None
    milliseconds = max(int((cut_at - time.monotonic() - LOCK_WAIT_MARGIN_S) * 1000), 1)
    milliseconds = min(milliseconds, MAX_LOCK_TIMEOUT_MS)
    return f"SET LOCAL lock_timeout = {milliseconds}"


def tuple_cursor(conn: psycopg.Connection) -> psycopg.Cursor[tuple[Any, ...]]:
    """A cursor returning tuples, for one statement at a time (never two in a pipeline). On
    a connection of leaseq's pools it is the one made when the connection was: psycopg sets a
    new cursor up on every use (its adapters, its query cache), about a tenth of a single
    enqueue's client time. On a caller's connection (``connection=``), a new one."""
    cursor = getattr(conn, _TUPLE_CURSOR, None)
    return cursor if cursor is not None else conn.cursor(row_factory=tuple_row)


def _direct(conn: psycopg.Connection, client_port: int | None, server_port: int) -> bool:
    """Whether ``conn`` talks to its server session directly, so that the session is this
    connection's alone until it ends: the server sees our socket's own port (TCP), or, over a
    Unix socket, no port and its own port in the socket's name. Behind a pooler (PgBouncer)
    the server session is handed to other clients once ours has gone, and ``_settle`` must
    not end it."""
    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            family, local = sock.family, sock.getsockname()
    except (OSError, ValueError, psycopg.Error):
        return False
    if family == socket.AF_UNIX:
        return client_port == -1 and conn.info.port == server_port
    return isinstance(local, tuple) and local[1] == client_port


#: libpq's words for an option value it does not take, said before it connects: "invalid
#: sslmode value", "invalid port number", "invalid integer value … for connection option".
_REFUSED_OPTION = re.compile(r"\binvalid (\w+ value|port number|integer value)\b")


#: What a server says while it restarts: a session ended by its shutdown (57P01), by a crash
#: of another backend (57P02), or a connection it cannot take yet (57P03, "the database system
#: is starting up / shutting down"; libpq's FATAL at connect carries no SQLSTATE, only text).
_RESTARTING = re.compile(r"database system is (starting up|shutting down|in recovery mode)|"
                         r"terminating connection|server closed the connection unexpectedly")


def restarting(exc: psycopg.OperationalError) -> bool:
    """Whether ``exc`` is a server restarting under the connection, or refusing it while it
    restarts."""
    return exc.sqlstate in ("57P01", "57P02", "57P03") or bool(_RESTARTING.search(str(exc)))


def _refused_option(exc: psycopg.OperationalError) -> bool:
    """Whether libpq refused one of the URL's option values (no server was asked: the error
    has no SQLSTATE). Told by its message, which libpq may translate: then it stays
    ``StoreUnavailable``, as it was, its message still naming the option."""
    return exc.sqlstate is None and bool(_REFUSED_OPTION.search(str(exc)))


def retryable(conn: psycopg.Connection | psycopg.AsyncConnection, exc: psycopg.Error) -> bool:
    """Whether a try that failed with ``exc`` may be made again (on a new connection when
    this one is lost or discarded): the connection lost or broken by it (a restart, the
    server's end to a session idle in a transaction, 25P03, any FATAL), the server's refusal
    of this try (a deadlock, a serialization failure: ``OperationalError``), a plan prepared
    before a migration changed a table, or a read-only server. Any other error (a constraint
    violation, a bug in a query) would fail again the same way: it is raised as it is."""
    ended = isinstance(exc, psycopg.errors.IdleInTransactionSessionTimeout)
    refused = isinstance(exc, psycopg.OperationalError) and not over_a_limit(exc)
    return ended or refused or conn.broken or conn.closed or discard_connection(exc)


def over_a_limit(exc: BaseException) -> bool:
    """SQLSTATE class 54, "program limit exceeded" (a value or a statement larger than the
    server takes): psycopg makes it an ``OperationalError``, but every retry would fail alike."""
    return isinstance(exc, psycopg.Error) and (exc.sqlstate or "").startswith("54")


def beyond_limit(url: str, line: str) -> InvalidInput:
    """The typed refusal of a call the server found over one of its limits (``over_a_limit``):
    its statement failed, so nothing of it was written."""
    return InvalidInput(f"PostgreSQL at {url} cannot take this call, over one of its limits: "
                        f"{line}; nothing was written")


#: What the server answers when the store itself cannot serve this role: a table, column or
#: function of its schema is missing (42P01, 42703, 42883), the schema is (3F000), or the role
#: lacks a privilege (42501). A retry would meet the same answer until someone fixes it.
STORE_REFUSALS = frozenset({"42P01", "42703", "42883", "3F000", "42501"})


def refused_by_the_store(exc: BaseException) -> bool:
    """Whether ``exc`` is one of the ``STORE_REFUSALS``."""
    return isinstance(exc, psycopg.Error) and exc.sqlstate in STORE_REFUSALS


def store_refused(url: str, line: str) -> StoreRefused:
    """The typed error of a statement the server refused for the store's own state
    (``refused_by_the_store``): it failed, so nothing of it was written."""
    return StoreRefused(f"PostgreSQL at {url} refused leaseq's statement: {line}; nothing was "
                        "written. A table or column of the store's schema is missing, or the "
                        "role lacks a privilege on it: check them with `leaseq doctor`, run "
                        "`leaseq migrate` as the schema's owner, or grant the role access")


def typed_refusal(exc: BaseException, url: str, line: str) -> LeaseqError | None:
    """The typed error of a server error that no retry can get past (over one of its limits,
    or refused for the store's own state); None for any other."""
    if over_a_limit(exc):
        return beyond_limit(url, line)
    if refused_by_the_store(exc):
        return store_refused(url, line)
    return None


def why(cause: BaseException, line: str) -> str:
    """The driver's first line (``line``, its password masked), after what to do when the
    server is read-only: the one cause a retry cannot ride out unless the URL leads
    somewhere else."""
    if _read_only(cause):
        return ("the server is read-only (a standby, or a primary demoted by a failover); "
                f"point the URL at the primary: {line}")
    return line


def discard_connection(exc: BaseException) -> bool:
    """Errors after which the connection is closed rather than put back as it is: its
    prepared statements return the columns ``jobs`` had when they were prepared (a migration
    added one since: every run fails, and psycopg keeps them in a cache of its own, which
    only a new connection surely empties), or its server is read-only (a standby, or a
    primary demoted by a failover: a new connection may reach the new primary)."""
    return _stale_plan(exc) or _read_only(exc)


def _stale_plan(exc: BaseException) -> bool:
    """SQLSTATE 0A000 raised where the server revalidates a cached plan: "cached plan must
    not change result type". The statement did nothing. Told by the server's function, which
    is not translated, rather than by the message, which is."""
    if not isinstance(exc, psycopg.errors.FeatureNotSupported):
        return False
    where = exc.diag.source_function or ""
    return where == "RevalidateCachedQuery" or "cached plan" in str(exc)


def _read_only(exc: BaseException) -> bool:
    """SQLSTATE 25006: a write sent to a read-only server; nothing was written."""
    return isinstance(exc, psycopg.errors.ReadOnlySqlTransaction)


def _dead(conn: psycopg.Connection) -> bool:
    """True when an idle connection was closed by the server (``server_closed``); it is
    closed here then, so the pool replaces it."""
    dead = server_closed(conn)
    if dead:
        conn.close()
    return dead


def server_closed(conn: psycopg.Connection | psycopg.AsyncConnection) -> bool:
    """True when an idle connection was closed by the server, found without a round trip.

    Nothing is sent to an idle connection of leaseq's (no LISTEN on it), so a readable socket
    means the server has gone (EOF, or a FATAL "terminating connection" before the close: a
    restart, an idle timeout). A false alarm costs one reconnect."""
    if conn.closed or conn.broken:
        return True
    try:
        return _readable(conn.fileno())
    except (OSError, ValueError, psycopg.Error):
        return True


def _readable(fd: int) -> bool:
    """Whether ``fd`` has input (or a hang-up) now; poll() has no limit on fd numbers."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])


def _password(url: str) -> str | None:
    try:
        return urlsplit(url).password or None
    except ValueError:
        return None
