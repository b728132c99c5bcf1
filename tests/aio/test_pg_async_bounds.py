"""PostgreSQL-specific: no async call waits without a bound (issue 14), as the blocking store's
(tests/postgres/test_pg_bounds.py).

A call that does not answer (here: a statement waiting on a table lock another connection
holds, standing in for a black-holed network) is cut from the client at ``call_timeout_s`` or
at the caller's ``leaseq.deadline``; the cut connection is closed, never reused; and the
server ends an async session left idle in a transaction after ``idle_in_transaction_s``.
Store-specific: the bounds and their messages are the PostgreSQL store's own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from leaseq import Queue, deadline
from leaseq.errors import StoreUnavailable
from leaseq.stores import connect
from leaseq.stores.postgres import PostgresStore
from leaseq.stores.postgres.options import parse_url

psycopg = pytest.importorskip("psycopg", reason="leaseq[postgres] is not installed")

pytestmark = pytest.mark.timeout(60)

#: Far under the 30 s a call that was never cut would wait here, well over 0.3 s plus the
#: scheduling slack of a busy machine (whose threads can wake half a second late, twice).
BOUND_S = 5.0


def _with(url: str, **options: object) -> str:
    return url + "".join(f"&{k}={v}" for k, v in options.items())


class JobsLock:
    """Another session that takes an exclusive lock on the jobs table and holds it until
    released: every statement on the table meanwhile waits, and never answers by itself."""

    def __init__(self, url: str):
        conninfo, options = parse_url(url)
        self._table = f'"{options.schema}".jobs'
        self._holder = psycopg.connect(conninfo)

    def take(self) -> None:
        self._holder.execute(f"LOCK TABLE {self._table} IN ACCESS EXCLUSIVE MODE")

    def release(self) -> None:
        self._holder.rollback()

    def close(self) -> None:
        self._holder.close()


@pytest.fixture
def jobs_lock(pg_store_url: str) -> Iterator[JobsLock]:
    """A job ``held`` in queue ``mail``, and the lock, not yet taken."""
    with connect(pg_store_url) as store:
        Queue(store, "mail").enqueue("held", {})
    lock = JobsLock(pg_store_url)
    try:
        yield lock
    finally:
        lock.close()


def _loop_connections(store: PostgresStore) -> list[psycopg.AsyncConnection]:
    """The idle async connections of the running loop."""
    return list(store._async._by_loop[asyncio.get_running_loop()]._idle)


@pytest.mark.parametrize("call", ["aget", "arequeue"])
def test_an_async_call_that_never_answers_is_cut_at_call_timeout(
        pg_store_url: str, jobs_lock: JobsLock, call: str) -> None:
    # Given a store whose calls may take 0.3 s, with one idle async connection
    store = connect(_with(pg_store_url, call_timeout_s=0.3))
    q = Queue(store, "mail")

    async def scenario() -> None:
        assert await q.acounts() == {"pending": 1}
        [first] = _loop_connections(store)  # type: ignore[arg-type]
        jobs_lock.take()
        started = time.monotonic()
        # When a read (or an operator's transaction) waits on a lock that is never released
        with pytest.raises(StoreUnavailable, match=r"no answer within call_timeout_s=0\.3") as err:
            await getattr(q, call)("held")
        # Then it was cut within its bound; nothing was committed, so the outcome is known
        assert time.monotonic() - started < BOUND_S
        assert "outcome is unknown" not in str(err.value)
        # And the cut connection was closed, not put back for the next call
        assert first.closed and first not in _loop_connections(store)  # type: ignore[arg-type]
        jobs_lock.release()
        # And the next call works, on a fresh connection
        job = await q.aget("held")
        assert job is not None and job.status == "pending"
        await store.aclose()

    try:
        asyncio.run(scenario())
    finally:
        store.close()


def test_an_async_write_cut_by_its_deadline_has_an_unknown_outcome(
        pg_store_url: str, jobs_lock: JobsLock) -> None:
    store = connect(_with(pg_store_url, call_timeout_s=0.3))
    q = Queue(store, "mail")

    async def scenario() -> None:
        jobs_lock.take()
        started = time.monotonic()
        # When an enqueue (one autocommitted statement) is cut while the server holds it
        with pytest.raises(StoreUnavailable, match="the outcome is unknown"):
            await q.aenqueue("new", {})
        # Then it is reported at once as unknown, never assumed done nor repeated
        assert time.monotonic() - started < BOUND_S
        jobs_lock.release()
        # And the caller acts on it safely: the server may still run the insert once the lock
        # goes (unknown means just that), and enqueueing the same job again is harmless
        await q.aenqueue("new", {})
        assert await q.aget("new") is not None
        await store.aclose()

    try:
        asyncio.run(scenario())
    finally:
        store.close()


def test_a_callers_deadline_is_shorter_than_the_async_call_timeout(
        pg_store_url: str, jobs_lock: JobsLock) -> None:
    store = connect(pg_store_url)  # call_timeout_s 30 s
    q = Queue(store, "mail")

    async def scenario() -> None:
        jobs_lock.take()
        started = time.monotonic()
        with deadline.within(0.3), pytest.raises(StoreUnavailable, match="caller's deadline"):
            await q.aget("held")
        assert time.monotonic() - started < BOUND_S
        await store.aclose()

    try:
        asyncio.run(scenario())
    finally:
        store.close()


def test_the_server_ends_an_async_session_idle_in_a_transaction(pg_store_url: str) -> None:
    # Given a store whose sessions may idle in a transaction for 200 ms at most
    store = connect(_with(pg_store_url, idle_in_transaction_s=0.2))
    assert isinstance(store, PostgresStore)
    conninfo, _ = parse_url(pg_store_url)

    async def scenario() -> None:
        async with store._async._conn() as conn:
            shown = await (await conn.execute(
                "SELECT current_setting('idle_in_transaction_session_timeout'), "
                "current_setting('TimeZone')")).fetchone()
            # Then each async connection carries the setting, and UTC
            assert shown == ("200ms", "UTC")
            # When its client leaves it idle inside a transaction (as one cut off would)
            pid = conn.info.backend_pid
            await conn.execute("BEGIN")
            await conn.execute("SELECT 1")
            # Then the server ends the session by itself
            assert await _gone(conninfo, pid, within_s=5.0)
            with pytest.raises(psycopg.Error):
                await conn.execute("SELECT 1")
        # And the store goes on, on a fresh connection
        assert await Queue(store, "mail").acounts() == {}
        await store.aclose()

    try:
        asyncio.run(scenario())
    finally:
        store.close()


async def _gone(conninfo: str, pid: int, within_s: float) -> bool:
    """Whether the server session ``pid`` ends within ``within_s``, seen from another one."""
    give_up = time.monotonic() + within_s
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as watcher:
        while time.monotonic() < give_up:
            cur = await watcher.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))
            if await cur.fetchone() is None:
                return True
            await asyncio.sleep(0.05)
    return False


def test_a_connection_whose_set_up_was_cancelled_is_not_kept(
        pg_store_url: str, jobs_lock: JobsLock, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a store whose new async connections stall in their set-up (a slow network)
    import leaseq.stores.postgres.aio as pg_aio

    store = connect(pg_store_url)
    assert isinstance(store, PostgresStore)
    configure = pg_aio._configure

    async def scenario() -> None:
        entered, never = asyncio.Event(), asyncio.Event()

        async def stalled(conn: psycopg.AsyncConnection, options: object) -> None:
            entered.set()
            await never.wait()

        monkeypatch.setattr(pg_aio, "_configure", stalled)
        # When the caller's call is cancelled during that set-up (a timeout around it)
        call = asyncio.ensure_future(Queue(store, "mail").aget("held"))
        await entered.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # Then the connection is closed, not kept idle with the role's own settings
        assert _loop_connections(store) == []
        # And the next call sets up a connection of its own
        monkeypatch.setattr(pg_aio, "_configure", configure)
        assert (await Queue(store, "mail").aget("held")) is not None
        (kept,) = _loop_connections(store)
        shown = await (await kept.execute("SELECT current_setting('TimeZone')")).fetchone()
        assert shown == ("UTC",)
        await store.aclose()

    try:
        asyncio.run(scenario())
    finally:
        store.close()


def test_idle_async_connections_the_server_closed_are_passed_over(pg_store_url: str) -> None:
    # Given a loop with three idle async connections
    store = connect(pg_store_url)
    assert isinstance(store, PostgresStore)
    conninfo, _ = parse_url(pg_store_url)
    q = Queue(store, "mail")

    async def scenario() -> None:
        await asyncio.gather(*(q.acounts() for _ in range(3)))
        idle = _loop_connections(store)
        assert len(idle) == 3
        # When the server ends their sessions (a restart, an idle timeout)
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as admin:
            for conn in idle:
                await admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        for conn in idle:
            assert await _gone(conninfo, conn.info.backend_pid, within_s=5.0)
        # Then each next call, a write too, runs on a fresh connection: none fails for a
        # connection it never sent anything on, nor reports its outcome unknown
        for n in range(3):
            await q.aenqueue(f"after-{n}", {})
        assert await q.acounts() == {"pending": 3}
        assert all(conn.closed for conn in idle)
        await store.aclose()

    try:
        asyncio.run(scenario())
    finally:
        store.close()
