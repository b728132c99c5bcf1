"""PostgreSQL-specific: the outbox's index ``jobs_outbox`` exists only where a dispatcher
prepared it (``prepare_outbox``; migration 012 dropped it from the schema). Store-specific
because the index, its concurrent build and the INVALID index a failed build leaves are
PostgreSQL's own; what every store promises (idempotent, same answers) is the conformance
suite's ``OutboxSuite``. The dispatcher's call: tests/rabbitmq/test_dispatcher_outbox.py.
"""

from __future__ import annotations

import logging
import threading

import psycopg
import pytest

from leaseq.stores.postgres import PostgresStore
from leaseq.testing.harness import wait_until

BUILT = "built the outbox index"


def outbox_index(store: PostgresStore, pg_url: str) -> tuple[int, bool, str] | None:
    """``(oid, valid, definition)`` of the schema's ``jobs_outbox``; None when it has none."""
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(
            "SELECT i.indexrelid::int, i.indisvalid, pg_get_indexdef(i.indexrelid) "
            "FROM pg_index i WHERE i.indexrelid = to_regclass(%s)",
            [f'"{store.options.schema}".jobs_outbox']).fetchone()
    return None if row is None else (row[0], row[1], row[2])


def build_waits(store: PostgresStore, pg_url: str) -> bool:
    """Whether a concurrent build of the schema's outbox index waits on a lock (the
    transactions older than it)."""
    with psycopg.connect(pg_url) as conn:
        return bool(conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE 'CREATE INDEX CONCURRENTLY%%' AND query LIKE %s",
            [f'%"{store.options.schema}".jobs%']).fetchall())


def leave_an_invalid_index(store: PostgresStore, pg_url: str) -> None:
    """What a concurrent build that failed leaves behind: an INVALID ``jobs_outbox`` (here a
    UNIQUE build over two pending jobs of one queue)."""
    q = store.queue("mail")
    q.enqueue_many([q.spec(i, {}) for i in ("a", "b")])
    with psycopg.connect(pg_url, autocommit=True) as conn, \
            pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(f'CREATE UNIQUE INDEX CONCURRENTLY jobs_outbox '
                     f'ON "{store.options.schema}".jobs (queue) WHERE status = \'pending\'')


def test_a_fresh_schema_has_no_outbox_index(store: PostgresStore, pg_url: str) -> None:
    # Given a store on a new schema (every migration applied, 012 the last to touch it)
    # Then the outbox's index is not there: enqueues and retries do not pay for it
    assert outbox_index(store, pg_url) is None
    with psycopg.connect(pg_url) as conn:
        versions = {r[0] for r in conn.execute(
            f'SELECT version FROM "{store.options.schema}".schema_migrations')}
    assert 12 in versions


def test_prepare_outbox_builds_a_valid_index_once(store: PostgresStore, pg_url: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    # Given a fresh schema with a few jobs
    caplog.set_level(logging.INFO, logger="leaseq.postgres")
    store.queue("mail").enqueue("j1", {})
    # When the outbox is prepared, twice
    store.prepare_outbox()
    first = outbox_index(store, pg_url)
    store.prepare_outbox()
    # Then jobs_outbox exists, is valid, holds only what the outbox owes, and was built once
    assert first is not None and first[1], first
    assert "(queue, lease_until, id) WHERE" in first[2] and "published_at IS NULL" in first[2]
    assert outbox_index(store, pg_url) == first
    assert sum(BUILT in r.message for r in caplog.records) == 1


def test_an_invalid_leftover_index_is_built_again(store: PostgresStore, pg_url: str) -> None:
    # Given an INVALID jobs_outbox left by a concurrent build that failed
    leave_an_invalid_index(store, pg_url)
    left = outbox_index(store, pg_url)
    assert left is not None and not left[1], left
    # When the outbox is prepared
    store.prepare_outbox()
    # Then the leftover was replaced by a valid index of the outbox's own definition
    built = outbox_index(store, pg_url)
    assert built is not None and built[1], built
    assert built[0] != left[0] and "UNIQUE" not in built[2]
    assert [j.id for j in store.queue("mail").outbox_due()] == ["a", "b"]


def test_a_failed_build_leaves_no_index_behind(store: PostgresStore, pg_url: str) -> None:
    # Given a build that fails (a UNIQUE definition over two pending jobs of one queue stands
    # in for a build the server gives up on)
    q = store.queue("mail")
    q.enqueue_many([q.spec(i, {}) for i in ("a", "b")])
    store.queries["create_outbox_index"] = store.queries["create_outbox_index"].replace(
        "CREATE INDEX", "CREATE UNIQUE INDEX").replace("(queue, lease_until, id)", "(queue)")
    # When the outbox is prepared / Then the failure is raised
    with pytest.raises(psycopg.errors.UniqueViolation):
        store.prepare_outbox()
    # and no INVALID index is left for every insert to write
    assert outbox_index(store, pg_url) is None
    assert [j.id for j in q.outbox_due()] == ["a", "b"]


def test_dispatchers_starting_together_build_it_once_without_deadlock(
        store: PostgresStore, schema_url: str, pg_url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    # Given a transaction writing to the jobs table, so the first build waits on it
    caplog.set_level(logging.INFO, logger="leaseq.postgres")
    schema = f'"{store.options.schema}"'
    writer = psycopg.connect(pg_url)
    (started,) = writer.execute("SELECT clock_timestamp()").fetchone() or (None,)
    writer.execute(f"LOCK TABLE {schema}.jobs IN ROW EXCLUSIVE MODE")
    others = [PostgresStore.from_url(schema_url) for _ in range(2)]
    errors: list[BaseException] = []

    def prepare(s: PostgresStore) -> None:
        try:
            s.prepare_outbox()
        except BaseException as exc:
            errors.append(exc)

    def waiting() -> int:
        """Sessions opened by this test that asked for the builders' lock and lack it."""
        with psycopg.connect(pg_url) as conn:
            return len(conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE backend_start >= %s"
                " AND pid <> pg_backend_pid()"
                " AND query LIKE '%%advisory_lock(hashtextextended(%%'"
                " AND pid <> ALL(SELECT pid FROM pg_locks WHERE locktype = 'advisory'"
                " AND granted)", [started]).fetchall())

    try:
        # When one dispatcher's build has started and two more start while it waits
        threads = [threading.Thread(target=prepare, args=(store,))]
        threads[0].start()
        wait_until(lambda: build_waits(store, pg_url), "the first build to wait on the writer")
        threads += [threading.Thread(target=prepare, args=(s,)) for s in others]
        for thread in threads[1:]:
            thread.start()
        wait_until(lambda: waiting() == 2, "both others to wait for the builder")
        writer.commit()
        for thread in threads:
            thread.join(60)
        # Then all three return, the index is valid, and it was built once (a waiter that
        # blocked inside the server would have deadlocked the build and failed it)
        assert errors == [] and not any(t.is_alive() for t in threads)
        index = outbox_index(store, pg_url)
        assert index is not None and index[1], index
        assert sum(BUILT in r.message for r in caplog.records) == 1
    finally:
        writer.close()
        for s in others:
            s.close()


def test_a_stopping_dispatcher_waits_neither_for_another_builder_nor_for_its_build(
        store: PostgresStore, schema_url: str, pg_url: str) -> None:
    # Given another process holding the builders' lock
    lock_key = f"leaseq.outbox_index.{store.options.schema}"
    holder = psycopg.connect(pg_url, autocommit=True)
    holder.execute(store.queries["try_lock_outbox_index"], {"key": lock_key})
    stop = threading.Event()
    try:
        # When the outbox is prepared with its dispatcher's stop set
        stop.set()
        store.prepare_outbox(stop)
        # Then it returns without waiting for the lock, and without an index
        assert outbox_index(store, pg_url) is None
    finally:
        holder.close()
    # Given a transaction writing to the jobs table, so that a build waits on it
    writer = psycopg.connect(pg_url)
    writer.execute(f'LOCK TABLE "{store.options.schema}".jobs IN ROW EXCLUSIVE MODE')
    stop.clear()
    done = threading.Event()

    def prepare() -> None:
        store.prepare_outbox(stop)
        done.set()

    thread = threading.Thread(target=prepare, daemon=True)
    try:
        thread.start()
        wait_until(lambda: build_waits(store, pg_url), "the build to wait on the writer")
        # When the dispatcher is asked to stop while its build waits
        stop.set()
        # Then the build is cut short and the call returns while the writer still holds its
        # transaction open (the INVALID index it left waits for the next start: its drop
        # would wait for the writer too)
        assert done.wait(10), "prepare_outbox still waits on the build"
        index = outbox_index(store, pg_url)
        assert index is None or not index[1], index
    finally:
        writer.close()
        thread.join(10)
    # And the next start drops what was left and builds it
    store.prepare_outbox()
    index = outbox_index(store, pg_url)
    assert index is not None and index[1], index
