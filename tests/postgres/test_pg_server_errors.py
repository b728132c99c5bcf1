"""PostgreSQL-specific: errors only a PostgreSQL server raises, ridden out or typed.

A column added to ``jobs`` under running workers (0A000 on every prepared statement), a
server that went read-only (25006), the server's end to a session idle in a transaction
(25P03), a database whose default isolation is REPEATABLE READ, a stalled migrator, options
past what PostgreSQL or Python can hold, and a call over one of the server's limits (54xxx).
They are here, not in the conformance suite, because no other store has such a server to
misbehave.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import psycopg
import pytest
from pg_locks import until_blocked_by
from pg_urls import with_option

from leaseq.errors import InvalidInput, InvalidURL, StoreRefused, StoreUnavailable
from leaseq.stores.postgres import PostgresStore
from leaseq.stores.postgres.options import parse_url
from leaseq.stores.postgres.watchdog import Watchdog

READ_ONLY = "options=-c%20default_transaction_read_only%3Don"
REPEATABLE_READ = "options=-c%20default_transaction_isolation%3Drepeatable%5C%20read"


def _schema(url: str) -> str:
    return url.rsplit("schema=", 1)[1].split("&")[0]


def _until_gone(pg_url: str, pid: int) -> None:
    """Return once the server session ``pid`` has ended (the server's timeout ended it)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        deadline = time.monotonic() + 10
        while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
            assert time.monotonic() < deadline, "the server never ended the idle session"
            time.sleep(0.01)


# --- sessions the server ended while their connections sat idle in the pool ---------------


def test_pool_connections_the_server_closed_are_replaced_without_a_retry(
        schema_url: str, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a store whose pool holds three idle connections, and whose retries would all
    # wait past reconnect_s (so a retry shows as StoreUnavailable, not as a pause)
    import leaseq.stores.postgres.session as session

    name = f"leaseq-idle-{_schema(schema_url)}"
    store = PostgresStore.from_url(with_option(schema_url, pool_min=3, pool_max=3,
                                               reconnect_s=2, application_name=name))
    monkeypatch.setattr(session, "FIRST_PAUSE_S", 30.0)
    try:
        q = store.queue("q")
        with psycopg.connect(pg_url, autocommit=True) as admin:
            deadline = time.monotonic() + 10
            while len(pids := [r[0] for r in admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                    [name])]) < 3:
                assert time.monotonic() < deadline, "the pool never opened its connections"
                time.sleep(0.01)
            # When the server ends their sessions (a restart, an idle timeout)
            for pid in pids:
                admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        for pid in pids:
            _until_gone(pg_url, pid)
        # Then the next calls, writes too, run on fresh connections at once: none waits a
        # retry's pause for connections it never sent anything on
        for n in range(3):
            q.enqueue(f"after-{n}", {})
        assert q.counts() == {"pending": 3}
    finally:
        store.close()


# --- a migration under running workers ---------------------------------------------------


def test_a_claim_and_a_finish_work_after_a_migration_adds_a_column_to_jobs(
        schema_url: str, pg_url: str) -> None:
    # Given a store whose one connection has its claim and finish prepared (six runs each)
    store = PostgresStore.from_url(with_option(schema_url, pool_max=1, reconnect_s=2))
    try:
        q = store.queue("q")
        for i in range(8):
            q.enqueue(f"j{i}", {"i": i})
        for _ in range(6):
            q.complete(q.claim("w1")[0])
        # When a newer leaseq's migration adds a column to jobs from another session
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'ALTER TABLE "{_schema(schema_url)}".jobs ADD COLUMN future_col int')
        # Then the same store claims and finishes as before
        claimed = q.claim("w1")
        assert [job.id for job in claimed] == ["j6"]
        assert q.complete(claimed[0]).status == "done"
    finally:
        store.close()


# --- a read-only server ------------------------------------------------------------------


def test_a_write_to_a_read_only_server_is_store_unavailable_saying_so(schema_url: str) -> None:
    # Given a migrated schema, reached over connections that are read-only (a standby)
    PostgresStore.from_url(schema_url).close()
    store = PostgresStore.from_url(f"{schema_url}&{READ_ONLY}", reconnect_s=0.3)
    try:
        # When a job is enqueued, then the error is leaseq's, and says what is wrong
        with pytest.raises(StoreUnavailable, match="read-only") as info:
            store.queue("q").enqueue("j1", {})
        assert not isinstance(info.value, psycopg.Error)
        with pytest.raises(StoreUnavailable, match="read-only"):
            store.queue("q").reclaim_expired()
    finally:
        store.close()


def test_a_store_that_must_migrate_on_a_read_only_server_is_store_unavailable(
        schema_url: str) -> None:
    # When a store opens a schema not yet created, over read-only connections
    with pytest.raises(StoreUnavailable, match="read-only") as info:
        PostgresStore.from_url(f"{schema_url}&{READ_ONLY}", reconnect_s=0.3)
    # Then it says so, not as a raw driver error
    assert "nothing was changed" in str(info.value)


# --- the server's end to a session idle in a transaction ----------------------------------


def test_a_transaction_ended_by_the_idle_timeout_is_run_again(
        schema_url: str, pg_url: str) -> None:
    # Given a store whose sessions the server ends after 0.3 s idle in a transaction
    store = PostgresStore.from_url(with_option(schema_url, idle_in_transaction_s=0.3))
    tries: list[int] = []

    def work(conn: Any) -> str:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        tries.append(pid)
        if len(tries) == 1:  # the client stalls between two statements until it is ended
            _until_gone(pg_url, pid)
        conn.execute("SELECT 2")
        return "done"

    try:
        # When the first try's session is ended between its statements, then the work is
        # run again on a new session (that try surely rolled back)
        assert store._session.run(work) == "done"
        assert len(tries) == 2 and tries[0] != tries[1]
    finally:
        store.close()


def test_a_session_ended_just_before_its_commit_is_an_unknown_outcome(
        schema_url: str, pg_url: str) -> None:
    # Given a write whose session the server ends after its last statement, before COMMIT
    store = PostgresStore.from_url(with_option(schema_url, idle_in_transaction_s=0.3))
    tries: list[int] = []

    def write(conn: Any) -> None:
        tries.append(1)
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        _until_gone(pg_url, pid)

    try:
        # When it runs, then the COMMIT's failure keeps the rule of a lost COMMIT: a write
        # is not run again blindly, and the error says the outcome is unknown
        with pytest.raises(StoreUnavailable, match="outcome is unknown"):
            store._session.run(write)
        assert tries == [1]
    finally:
        store.close()


# --- first use -----------------------------------------------------------------------------


def _open_in_thread(url: str, results: list[object], **options: Any) -> threading.Thread:
    def open_store() -> None:
        try:
            store = PostgresStore.from_url(url, **options)
        except Exception as exc:
            results.append(exc)
        else:
            results.append("opened")
            store.close()

    thread = threading.Thread(target=open_store, daemon=True)
    thread.start()
    return thread


def _migration_lock_holder(pg_url: str, schema_url: str) -> psycopg.Connection:
    holder = psycopg.connect(pg_url)
    holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                   [f"leaseq.migrate.{_schema(schema_url)}"])
    return holder


def test_first_users_under_repeatable_read_migrate_once(schema_url: str, pg_url: str) -> None:
    # Given a database whose default isolation is REPEATABLE READ, and two first users of a
    # new schema both waiting on the migration lock (their snapshot taken before it)
    url = f"{schema_url}&{REPEATABLE_READ}"
    holder = _migration_lock_holder(pg_url, schema_url)
    results: list[object] = []
    try:
        threads = [_open_in_thread(url, results) for _ in range(2)]
        until_blocked_by(pg_url, holder.info.backend_pid, waiters=2)
    finally:
        holder.rollback()
        holder.close()
    # When the lock is let go, then both open: the second finds what the first applied
    for thread in threads:
        thread.join(30)
    assert results == ["opened", "opened"]


def test_a_migration_that_fails_is_not_reported_as_a_bad_url(
        schema_url: str, pg_url: str) -> None:
    # Given a schema that holds a table named jobs that is not leaseq's
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{_schema(schema_url)}"')
        conn.execute(f'CREATE TABLE "{_schema(schema_url)}".jobs (x int)')
    # When a store opens it, then the migration's failure is StoreUnavailable, not InvalidURL
    with pytest.raises(StoreUnavailable, match="nothing was changed") as info:
        PostgresStore.from_url(schema_url)
    assert not isinstance(info.value, InvalidURL)


def test_opening_behind_a_stalled_migrator_gives_up_at_reconnect_s(
        schema_url: str, pg_url: str) -> None:
    # Given a migrator that holds the schema's migration lock and has stalled
    holder = _migration_lock_holder(pg_url, schema_url)
    results: list[object] = []
    try:
        # When a store opens the schema with reconnect_s=0.5
        thread = _open_in_thread(schema_url, results, reconnect_s=0.5)
        thread.join(2.0)
        # Then it gave up while the lock was still held, saying why
        assert not thread.is_alive(), "the open waited past reconnect_s"
    finally:
        holder.rollback()
        holder.close()
    thread.join(30)
    assert len(results) == 1 and isinstance(results[0], StoreUnavailable)
    assert "migration lock" in str(results[0])


def test_opening_behind_a_migrator_that_finishes_in_time_succeeds(
        schema_url: str, pg_url: str) -> None:
    # Given a migrator holding the lock, and a store waiting on it with time to spare
    holder = _migration_lock_holder(pg_url, schema_url)
    results: list[object] = []
    try:
        thread = _open_in_thread(schema_url, results, reconnect_s=5)
        until_blocked_by(pg_url, holder.info.backend_pid)
    finally:
        # When the migrator lets go
        holder.rollback()
        holder.close()
    # Then the store opens
    thread.join(30)
    assert results == ["opened"]


# --- options past the limits -----------------------------------------------------------------


def test_an_idle_in_transaction_s_past_postgresqls_limit_is_an_invalid_url() -> None:
    parse_url("postgresql://db/jobs?idle_in_transaction_s=2147483")  # the most it takes
    with pytest.raises(InvalidURL, match="idle_in_transaction_s must be at most"):
        parse_url("postgresql://app:s3cret@db/jobs?idle_in_transaction_s=3000000")


def test_a_watchdog_with_a_far_horizon_still_cuts_a_call_at_its_deadline() -> None:
    # Given a watchdog for call_timeout_s=1e10, asleep until its first call's far deadline
    watchdog = Watchdog(horizon_s=1e10)
    far, near = socket.socketpair()
    try:
        watchdog.watch(far, time.monotonic() + 1e10)
        asleep_by = time.monotonic() + 10
        while watchdog._wakes_at == float("inf") and time.monotonic() < asleep_by:
            time.sleep(0.001)
        assert watchdog._wakes_at != float("inf"), "the watchdog never went to sleep"
        with watchdog._cond:  # taken only once the thread waits (or has died)
            pass
        # When a call with a near deadline comes, then it is cut at that deadline
        watchdog.watch(near, time.monotonic() + 0.05)
        deadline = time.monotonic() + 10
        while watchdog.cuts == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watchdog.cuts == 1
    finally:
        watchdog.close()
        far.close()
        near.close()


def test_the_async_calls_after_a_migration_adds_a_column_fail_typed_then_work(
        schema_url: str, pg_url: str) -> None:
    # Given a store whose async reads have been prepared on their loop's connection
    import asyncio

    store = PostgresStore.from_url(schema_url)
    q = store.queue("q")
    q.enqueue("j1", {})

    async def scenario() -> list[object]:
        for _ in range(6):
            assert (await q.aget("j1")) is not None
        # When a newer leaseq's migration adds a column to jobs from another session
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'ALTER TABLE "{_schema(schema_url)}".jobs ADD COLUMN future_col int')
        # Then the next call fails with leaseq's error (a raw FeatureNotSupported before,
        # on every call: the connection kept its stale plans), and the one after works
        outcomes: list[object] = []
        for _ in range(2):
            try:
                outcomes.append((await q.aget("j1")).status)  # type: ignore[union-attr]
            except StoreUnavailable:
                outcomes.append("unavailable")
        return outcomes

    try:
        outcomes = asyncio.run(scenario())
    finally:
        store.close()
    assert outcomes in (["unavailable", "pending"], ["pending", "pending"])


# --- a call over one of the server's limits (SQLSTATE class 54) ---------------------------

#: A statement the server refuses at once with 54000, "requested length too large": what a
#: value over one of its limits gets. psycopg makes it an OperationalError, as it does a lost
#: connection.
OVER_A_LIMIT = "SELECT repeat('x', 1 << 30)"


def test_a_call_over_one_of_the_servers_limits_is_invalid_input_at_once(schema_url: str) -> None:
    store = PostgresStore.from_url(with_option(schema_url, reconnect_s=30))
    try:
        started = time.monotonic()
        with pytest.raises(InvalidInput, match="over one of its limits: requested length"):
            store._session.run(lambda conn: conn.execute(OVER_A_LIMIT).fetchone())
        # Not tried again until reconnect_s ran out, then called an unavailable server
        assert time.monotonic() - started < 10
        assert store.queue("q").counts() == {}  # the connection is fit for the next call
    finally:
        store.close()


def test_an_async_call_over_one_of_the_servers_limits_is_invalid_input(schema_url: str) -> None:
    import asyncio

    store = PostgresStore.from_url(schema_url)
    q = store.queue("q")
    q.enqueue("j1", {})

    async def scenario() -> str:
        with pytest.raises(InvalidInput, match="over one of its limits: requested length"):
            async with store._async._conn() as conn:
                await conn.execute(OVER_A_LIMIT)
        return (await q.aget("j1")).status  # type: ignore[union-attr]

    try:
        assert asyncio.run(scenario()) == "pending"
    finally:
        store.close()


# --- a store the server refuses for its own state: a table missing, a privilege lacking -----


def _rename_table(pg_url: str, schema_url: str, name: str, to: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "{_schema(schema_url)}".{name} RENAME TO {to}')


def test_a_table_gone_from_the_schema_is_store_refused_at_once(
        schema_url: str, pg_url: str) -> None:
    # Given a store whose jobs table someone renamed by hand
    store = PostgresStore.from_url(with_option(schema_url, reconnect_s=30))
    q = store.queue("q")
    q.enqueue("j1", {})
    _rename_table(pg_url, schema_url, "jobs", "jobs_old")
    try:
        # When it is read, Then it is StoreRefused (a StoreUnavailable, as callers already
        # take it) saying what to check, at once, and not psycopg's own error
        started = time.monotonic()
        with pytest.raises(StoreRefused, match=r'relation ".*jobs" does not exist') as info:
            q.counts()
        assert isinstance(info.value, StoreUnavailable)
        assert "leaseq doctor" in str(info.value)
        assert time.monotonic() - started < 10  # not retried until reconnect_s ran out
        # And once the table is back, the same store goes on
        _rename_table(pg_url, schema_url, "jobs_old", "jobs")
        assert q.counts() == {"pending": 1}
    finally:
        store.close()


def test_an_async_call_on_a_table_gone_is_store_refused(schema_url: str, pg_url: str) -> None:
    import asyncio

    store = PostgresStore.from_url(schema_url)
    q = store.queue("q")
    q.enqueue("j1", {})
    _rename_table(pg_url, schema_url, "jobs", "jobs_old")

    async def scenario() -> None:
        with pytest.raises(StoreRefused, match="does not exist"):
            await q.aget("j1")
        with pytest.raises(StoreRefused, match="does not exist"):
            await q.aenqueue("j2", {})

    try:
        asyncio.run(scenario())
    finally:
        store.close()


def test_a_role_without_a_privilege_is_store_refused(schema_url: str, pg_url: str) -> None:
    # Given a role that may read the schema's version but not its jobs (a monitoring role
    # granted too little)
    store = PostgresStore.from_url(schema_url)
    store.close()
    schema, role = _schema(schema_url), f"ro_{_schema(schema_url)}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        conn.execute(f'GRANT SELECT ON "{schema}".schema_migrations TO "{role}"')
    parts = schema_url.split("://", 1)[1].split("@", 1)[-1]
    try:
        # When it reads the queue's counts
        ro = PostgresStore.from_url(f"postgresql://{role}@{parts}")
        try:
            with pytest.raises(StoreRefused, match="permission denied"):
                ro.queue("q").counts()
        finally:
            ro.close()
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')


def test_the_commands_say_a_refused_store_in_one_line(schema_url: str, pg_url: str) -> None:
    from click.testing import CliRunner

    from leaseq.cli import cli

    # Given a store whose jobs table is gone (renamed by hand)
    PostgresStore.from_url(schema_url).close()
    _rename_table(pg_url, schema_url, "jobs", "jobs_old")
    # When status and doctor read it, Then each says so in one line and exits 1
    for command in ("status", "doctor"):
        result = CliRunner().invoke(cli, [command, "--url", schema_url])
        assert result.exit_code == 1, result.output
        assert result.output.startswith("leaseq: PostgreSQL at ") and "does not exist" in (
            result.output) and result.output.count("\n") == 1, result.output
