"""The PostgreSQL store's asyncio face: psycopg's ``AsyncConnection``, the same named SQL as
the blocking store.

A connection belongs to the event loop that opened it, so each running loop has its own
(``LoopConnections``: at most ``pool_max``, idle ones reused); ``aclose()`` closes the running
loop's. Enqueue follows the blocking store's plan exactly: one autocommitted statement for
new ids, else the careful path (``EnqueuePlan``) under a savepoint, in the caller's transaction
with ``connection=aconn`` or in one of its own. Unlike the blocking store, a lost connection
is not retried here: the error surfaces as ``StoreUnavailable`` at once.
"""

from __future__ import annotations

import asyncio
import random
import weakref
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.errors import UniqueViolation
from psycopg.rows import dict_row

from leaseq.errors import InvalidInput, JobConflict, JobNotFound, StoreUnavailable
from leaseq.job import EnqueueOutcome, EnqueueResult, Job, JobSpec, JournalEntry, OnConflict
from leaseq.stores.postgres.enqueue import batch_columns, one_columns
from leaseq.stores.postgres.plan import EnqueuePlan, enqueued_data

if TYPE_CHECKING:
    from leaseq.stores.postgres.store import PostgresStore

_SAVEPOINT = "leaseq_aenqueue"
_INSERT_RACES = 64  # as the blocking store's: see enqueue.py


async def _configure(conn: psycopg.AsyncConnection) -> None:
    """As the blocking pool's connections (session.py says why)."""
    await conn.execute("SET TIME ZONE 'UTC'")
    await conn.execute("SET plan_cache_mode = force_custom_plan")


class LoopConnections:
    """The async connections of one event loop: at most ``size`` open at once, idle ones
    reused. Deliberately no background task (as a pool's): a program that ends its loop
    (``asyncio.run``) without ``aclose()`` must not hang on a task that outlives it."""

    def __init__(self, conninfo: str, size: int):
        self._conninfo = conninfo
        self._slots = asyncio.Semaphore(size)
        self._idle: list[psycopg.AsyncConnection] = []

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        async with self._slots:
            conn = self._idle.pop() if self._idle else await self._connect()
            try:
                yield conn
            finally:
                await self._give_back(conn)

    async def _connect(self) -> psycopg.AsyncConnection:
        conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        await _configure(conn)
        return conn

    async def _give_back(self, conn: psycopg.AsyncConnection) -> None:
        """Keep a healthy connection, idle (outside any transaction); drop a broken one."""
        if conn.closed or conn.broken:
            return
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                await conn.rollback()
            except psycopg.Error:
                await conn.close()
                return
        self._idle.append(conn)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()


class AsyncPostgres:
    """The async primitives of one ``PostgresStore``."""

    def __init__(self, store: PostgresStore, conninfo: str):
        self._store = store
        self._conninfo = conninfo
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                                 LoopConnections] = weakref.WeakKeyDictionary()

    # --- plumbing ---------------------------------------------------------------------------

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[psycopg.AsyncConnection]:
        loop = asyncio.get_running_loop()
        connections = self._by_loop.get(loop)
        if connections is None:
            connections = self._by_loop[loop] = LoopConnections(
                self._conninfo, self._store.options.pool_max)
        try:
            async with connections.connection() as conn:
                yield conn
        except psycopg.OperationalError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreUnavailable(f"PostgreSQL at {self._store.url}: {first[:300]}") from None

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
        async with self._conn() as conn:
            results = await self._enqueue_new(conn, queue, specs)
            if results is not None:
                return results
            async with conn.transaction():
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
        async with self._conn() as conn, conn.transaction():
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
