"""The PostgreSQL store's asyncio face: psycopg's ``AsyncConnection``, the same named SQL as
the blocking store.

A connection belongs to the event loop that opened it, so each running loop has its own
(``LoopConnections``: at most ``pool_max``, idle ones reused); ``aclose()`` closes the running
loop's. Enqueue follows the blocking store's plan exactly: one autocommitted statement for
new ids, else the careful path (``EnqueuePlan``) under a savepoint, in the caller's transaction
with ``connection=aconn`` or in one of its own.

Bounds, as the blocking store's: every call on leaseq's own connections is cut at
``call_timeout_s`` (or the caller's shorter ``leaseq.deadline``), see ``Call``; waiting for a
connection stops at ``reconnect_s`` (at least 1 s) or the caller's deadline; connections are
set up as the blocking pool's (UTC, ``idle_in_transaction_session_timeout``). Unlike the
blocking store, a lost or cut connection is not retried here: the call raises
``StoreUnavailable`` at once, saying the outcome is unknown when a write may have committed
(a cut autocommitted statement, a cut COMMIT), exactly as the blocking store words it.
"""

from __future__ import annotations

import asyncio
import random
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.errors import UniqueViolation
from psycopg.rows import dict_row

from leaseq import deadline as caller_deadline
from leaseq.errors import InvalidInput, JobConflict, JobNotFound, StoreUnavailable
from leaseq.job import EnqueueOutcome, EnqueueResult, Job, JobSpec, JournalEntry, OnConflict
from leaseq.stores.postgres.enqueue import batch_columns, one_columns
from leaseq.stores.postgres.options import PostgresOptions
from leaseq.stores.postgres.plan import EnqueuePlan, enqueued_data
from leaseq.stores.postgres.session import (
    discard_connection,
    retryable,
    server_closed,
    session_settings,
    typed_refusal,
    why,
)
from leaseq.stores.postgres.watchdog import cut

if TYPE_CHECKING:
    from leaseq.stores.postgres.store import PostgresStore

_SAVEPOINT = "leaseq_aenqueue"
_INSERT_RACES = 64  # as the blocking store's: see enqueue.py


async def _configure(conn: psycopg.AsyncConnection, options: PostgresOptions) -> None:
    """As the blocking pool's connections (session.py's ``_configure`` says why), in one round
    trip."""
    await conn.execute(f"{session_settings(options)}; SET plan_cache_mode = force_custom_plan")


class Call:
    """One call's connection and its client-side deadline, ``call_timeout_s`` from checkout or
    the caller's deadline when that comes first. At the deadline the connection's socket is
    shut down (the blocking store's ``Watchdog`` cut), so psycopg's wait ends at once with a
    lost connection, which is then closed, never reused. Not ``asyncio.timeout``: psycopg
    answers a cancelled query by asking the server to cancel it and waiting for that, up to
    10 s more on a dead network. One timer on the loop per call: no thread, no round trip."""

    __slots__ = ("_timer", "by_callers", "conn", "cut", "timeout_s")

    def __init__(self, conn: psycopg.AsyncConnection, timeout_s: float):
        self.conn = conn
        self.timeout_s = timeout_s
        at = time.monotonic() + timeout_s
        callers = caller_deadline.current()
        self.by_callers = callers is not None and callers < at
        if callers is not None and self.by_callers:
            at = callers
        self.cut = False
        self._timer = asyncio.get_running_loop().call_later(
            max(at - time.monotonic(), 0.0), self._expire)

    def _expire(self) -> None:
        self.cut = True
        cut(self.conn)

    def disarm(self) -> None:
        self._timer.cancel()

    def why(self) -> str:
        """Why the call ended without an answer, for an error message."""
        if not self.cut:
            return "the connection was lost"
        if self.by_callers:
            return "no answer by the caller's deadline"
        return f"no answer within call_timeout_s={self.timeout_s:g} s"


class _NoConnection(Exception):
    """No connection came in time (all in use, or the server does not answer a connect)."""

    def __init__(self, waited_s: float, by_callers: bool):
        super().__init__(f"waited {waited_s:g} s")
        self.waited_s = waited_s
        self.by_callers = by_callers


class _CommitLost(Exception):
    """The connection was lost during COMMIT: the transaction may or may not have committed."""

    def __init__(self, cause: psycopg.Error):
        super().__init__(str(cause))
        self.cause = cause


class LoopConnections:
    """The async connections of one event loop: at most ``pool_max`` open at once, idle ones
    reused. Deliberately no background task (as a pool's): a program that ends its loop
    (``asyncio.run``) without ``aclose()`` must not hang on a task that outlives it."""

    def __init__(self, conninfo: str, options: PostgresOptions):
        self._conninfo = conninfo
        self._options = options
        self._slots = asyncio.Semaphore(options.pool_max)
        self._idle: list[psycopg.AsyncConnection] = []

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Call]:
        """A connection for one call, under that call's deadline (see ``Call``) until it is
        back among the idle ones (a rollback there is a round trip too). Raises
        ``_NoConnection`` when none comes in time."""
        conn, fresh = await self._checkout()
        try:
            call = Call(conn, self._options.call_timeout_s)
            try:
                if fresh:
                    await self._configure(call)
                yield call
            finally:
                try:
                    await self._give_back(call)
                finally:
                    call.disarm()
        finally:
            self._slots.release()

    async def _checkout(self) -> tuple[psycopg.AsyncConnection, bool]:
        """A slot, and an idle connection or a new one (True); as the blocking pool's
        checkout, within ``reconnect_s`` (at least 1 s) or the caller's deadline. An idle one
        the server has closed is closed and passed over: a call on it would fail without
        having reached the server, a write with its outcome reported unknown."""
        wait_s = max(self._options.reconnect_s, 1.0)
        left = caller_deadline.remaining_s()
        by_callers = left is not None and left < wait_s
        if left is not None and by_callers:
            wait_s = max(left, 0.05)
        try:
            async with asyncio.timeout(wait_s):
                await self._slots.acquire()
                try:
                    while self._idle:
                        conn = self._idle.pop()
                        if not server_closed(conn):
                            return conn, False
                        await conn.close()  # a restart, an idle timeout: nothing was sent
                    return await psycopg.AsyncConnection.connect(
                        self._conninfo, autocommit=True), True
                except BaseException:
                    self._slots.release()
                    raise
        except TimeoutError:
            raise _NoConnection(wait_s, by_callers) from None

    async def _configure(self, call: Call) -> None:
        """A new connection's settings; one whose set-up did not finish (cancelled, cut at
        its deadline, refused) is marked cut, so that it is closed, never kept idle with the
        role's own settings."""
        try:
            await _configure(call.conn, self._options)
        except BaseException:
            call.cut = True
            raise

    async def _give_back(self, call: Call) -> None:
        """Keep a healthy connection, idle (outside any transaction); close a broken one, or
        one cut at its deadline (it may be mid-protocol, even if its call had just ended)."""
        conn = call.conn
        if call.cut or conn.closed or conn.broken:
            await conn.close()
            return
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                await conn.rollback()
            except psycopg.Error:
                await conn.close()
                return
        if call.cut:  # the rollback outlived the deadline
            await conn.close()
            return
        self._idle.append(conn)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()


@asynccontextmanager
async def _transaction(conn: psycopg.AsyncConnection) -> AsyncIterator[None]:
    """BEGIN … COMMIT on one of leaseq's connections (autocommit): an error in the block leaves
    the rollback to ``_give_back``; a connection lost during COMMIT raises ``_CommitLost``."""
    await conn.execute("BEGIN")
    yield
    try:
        await conn.execute("COMMIT")
    except psycopg.Error as exc:  # an OperationalError, or the idle-in-transaction timeout
        if conn.broken:
            raise _CommitLost(exc) from None
        raise  # the server refused the COMMIT: rolled back


class AsyncPostgres:
    """The async primitives of one ``PostgresStore``."""

    def __init__(self, store: PostgresStore, conninfo: str):
        self._store = store
        self._conninfo = conninfo
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                                 LoopConnections] = weakref.WeakKeyDictionary()

    # --- plumbing ---------------------------------------------------------------------------

    @asynccontextmanager
    async def _conn(self, *, writes: bool = False) -> AsyncIterator[psycopg.AsyncConnection]:
        """One call on a connection of the running loop's. ``writes``: the block runs one
        autocommitted write, so a connection lost under it leaves the outcome unknown."""
        loop = asyncio.get_running_loop()
        connections = self._by_loop.get(loop)
        if connections is None:
            connections = self._by_loop[loop] = LoopConnections(
                self._conninfo, self._store.options)
        try:
            async with connections.connection() as call:
                try:
                    yield call.conn
                except _CommitLost as exc:
                    raise self._unknown(exc.cause) from None
                except psycopg.Error as exc:
                    typed = typed_refusal(exc, self._store.url,
                                          self._store._session.error_line(exc))
                    if typed is not None:
                        raise typed from None
                    if not retryable(call.conn, exc):
                        raise  # a constraint, a bug in a query: it would fail again alike
                    if discard_connection(exc):
                        call.cut = True  # closed, not kept: stale plans, or a read-only server
                    # As the blocking store's _statement: an error the server reported
                    # aborted the statement; a bare lost connection may have cut off the
                    # answer to one that committed.
                    if writes and exc.sqlstate is None and call.conn.broken:
                        raise self._unknown(exc) from None
                    raise self._unavailable(exc, call.why() if call.conn.broken else None
                                            ) from None
        except psycopg.OperationalError as exc:  # connecting, or setting a connection up
            raise self._unavailable(exc, None) from None
        except _NoConnection as exc:
            within = "the caller's deadline" if exc.by_callers else f"{exc.waited_s:g} s"
            raise StoreUnavailable(f"PostgreSQL at {self._store.url} is unavailable (no "
                                   f"connection within {within})") from None

    def _unknown(self, exc: psycopg.Error) -> StoreUnavailable:
        return StoreUnavailable(
            f"lost the connection to PostgreSQL at {self._store.url} while committing; the "
            f"outcome is unknown: {self._store._session.error_line(exc)}")

    def _unavailable(self, exc: psycopg.Error, broken: str | None) -> StoreUnavailable:
        shown = f" ({broken})" if broken else ""
        return StoreUnavailable(f"PostgreSQL at {self._store.url} is unavailable{shown}: "
                                f"{why(exc, self._store._session.error_line(exc))}")

    async def close(self) -> None:
        connections = self._by_loop.pop(asyncio.get_running_loop(), None)
        if connections is not None:
            await connections.close()

    async def _rows(self, conn: psycopg.AsyncConnection, name: str,
                    **params: Any) -> list[dict[str, Any]]:
        params["off"] = float(self._store.time_offset_s)
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self._store.queries[name], params)
            return await cur.fetchall() if cur.description else []

    async def _read(self, name: str, **params: Any) -> list[dict[str, Any]]:
        async with self._conn() as conn:
            return await self._rows(conn, name, **params)

    # --- enqueue ----------------------------------------------------------------------------

    async def enqueue_many(self, queue: str, specs: Sequence[JobSpec], on_conflict: OnConflict,
                           connection: Any) -> list[EnqueueResult]:
        if connection is not None:
            _check_connection(connection)
            return await self._enqueue(connection, queue, specs, on_conflict)
        # Two calls, as the blocking store: the fast try wrote nothing when it returns None.
        async with self._conn(writes=True) as conn:
            results = await self._enqueue_new(conn, queue, specs)
        if results is not None:
            return results
        async with self._conn() as conn, _transaction(conn):
            return await self._enqueue(conn, queue, specs, on_conflict, fast=False)

    async def _enqueue_new(self, conn: psycopg.AsyncConnection, queue: str,
                           specs: Sequence[JobSpec]) -> list[EnqueueResult] | None:
        """New ids in one autocommitted statement on leaseq's own connection, as the blocking
        store; None, having written nothing, when the careful path must decide."""
        if len(specs) == 1:
            return await self._enqueue_one(conn, queue, specs[0])
        try:
            return await self._enqueue_fast(conn, queue, specs)
        except UniqueViolation:
            return None  # autocommit: the statement wrote nothing

    async def _enqueue_one(self, conn: psycopg.AsyncConnection, queue: str,
                           spec: JobSpec) -> list[EnqueueResult] | None:
        """The blocking store's ``_enqueue_one``."""
        channel = self._store.options.channel
        if spec.revision is None:
            rows = await self._rows(conn, "enqueue_one", queue=queue, channel=channel,
                                    **one_columns(spec))
            inserted = bool(rows)
        else:
            rows = await self._rows(conn, "enqueue_one_journaled", queue=queue, channel=channel,
                                    data=enqueued_data(spec), **one_columns(spec))
            inserted = bool(rows[0]["inserted"])
        return [EnqueueResult(spec.job_id, EnqueueOutcome.CREATED)] if inserted else None

    async def _enqueue(self, conn: psycopg.AsyncConnection, queue: str,
                       specs: Sequence[JobSpec], on_conflict: OnConflict,
                       fast: bool = True) -> list[EnqueueResult]:
        """In ``conn``'s transaction under a savepoint: a conflict or an error undoes only
        this call, and a lost insert race is decided again (as the blocking store)."""
        for _ in range(_INSERT_RACES):
            await conn.execute(f"SAVEPOINT {_SAVEPOINT}")
            try:
                results = await self._try_enqueue(conn, queue, specs, on_conflict, fast)
            except BaseException:
                if not conn.broken:
                    await conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
                raise
            if results is not None:
                await conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
                return results
            await conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            fast = False
            await asyncio.sleep(random.uniform(0, 0.002))
        raise StoreUnavailable(f"queue {queue!r}: enqueue kept racing concurrent inserts of "
                               "the same ids; try again")

    async def _try_enqueue(self, conn: psycopg.AsyncConnection, queue: str,
                           specs: Sequence[JobSpec], on_conflict: OnConflict,
                           fast: bool) -> list[EnqueueResult] | None:
        if fast:
            try:
                results = await self._enqueue_fast(conn, queue, specs)
            except UniqueViolation:
                results = None
            if results is not None:
                return results
            await conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")  # start clean
        return await self._enqueue_once(conn, queue, specs, on_conflict)

    async def _enqueue_fast(self, conn: psycopg.AsyncConnection, queue: str,
                            specs: Sequence[JobSpec]) -> list[EnqueueResult] | None:
        """The blocking store's ``_enqueue_fast``: None, having written nothing, when an id
        repeats in the batch. Raises ``UniqueViolation`` when one exists already."""
        ids = [s.job_id for s in specs]
        if not specs or len(set(ids)) != len(ids):
            return None
        await self._rows(conn, "enqueue_fast", queue=queue,
                         channel=self._store.options.channel, **batch_columns(specs))
        return [EnqueueResult(i, EnqueueOutcome.CREATED) for i in ids]

    async def _enqueue_once(self, conn: psycopg.AsyncConnection, queue: str,
                            specs: Sequence[JobSpec], on_conflict: OnConflict
                            ) -> list[EnqueueResult] | None:
        ids = sorted({s.job_id for s in specs})
        rows = {r["id"]: r for r in await self._rows(conn, "find_existing", queue=queue, ids=ids)}
        plan = EnqueuePlan(queue)
        for spec in specs:
            plan.decide(spec, rows.get(spec.job_id), on_conflict)
            rows.setdefault(spec.job_id, plan.inserted_row(spec))
        if plan.conflicts and on_conflict == "raise":
            raise JobConflict(queue, plan.conflicts)
        if plan.inserts:
            won = await self._rows(conn, "insert_jobs", **plan.insert_columns())
            if len(won) < len(plan.inserts):
                return None
        if plan.writes:
            for name, params in plan.updates:
                await self._rows(conn, name, **params)
            if plan.journal:
                await self._rows(conn, "journal_enqueued", **plan.journal_columns())
            await self._rows(conn, "notify", channel=self._store.options.channel, queue=queue)
        return plan.results

    # --- inspection and operators -----------------------------------------------------------

    async def get(self, queue: str, job_id: str) -> Job | None:
        rows = await self._read("get", queue=queue, id=job_id)
        return self._store._job(rows[0]) if rows else None

    async def counts(self, queue: str) -> dict[str, int]:
        return {r["status"]: int(r["n"]) for r in await self._read("counts", queue=queue)}

    async def journal(self, queue: str, job_id: str) -> list[JournalEntry]:
        rows = await self._read("journal", queue=queue, id=job_id)
        return [self._store._entry(r) for r in rows]

    async def operator(self, queue: str, job_id: str, name: str) -> bool:
        """``operator_requeue`` or ``operator_cancel`` in one transaction (as the blocking)."""
        async with self._conn() as conn, _transaction(conn):
            if int((await self._rows(conn, name, queue=queue, id=job_id))[0]["n"]):
                if name == "operator_requeue":
                    await self._rows(conn, "notify", channel=self._store.options.channel,
                                     queue=queue)
                return True
            if not await self._rows(conn, "exists", queue=queue, id=job_id):
                raise JobNotFound(queue, job_id)
            return False


def _check_connection(connection: Any) -> None:
    if not isinstance(connection, psycopg.AsyncConnection):
        raise TypeError("connection= must be a psycopg.AsyncConnection for aenqueue on the "
                        "PostgreSQL store (enqueue takes a psycopg.Connection)")
    idle = connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    if connection.autocommit and idle:
        raise InvalidInput("connection= is in autocommit mode with no open transaction: "
                           "open one first (async with aconn.transaction(): ...)")
