"""PostgreSQL-specific: a statement retried because its answer was lost after the server
committed (the connection cut between the commit and the reply) tells the story once, and a
claim retried so returns the jobs it took (rather than leave them held by nobody)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from pg_urls import with_option

from leaseq import deadline
from leaseq.delivery.dispatcher import Dispatcher
from leaseq.errors import StoreUnavailable
from leaseq.job import Job
from leaseq.stores.postgres import PostgresStore
from leaseq.stores.postgres.session import _BACKEND as BACKEND
from leaseq.stores.postgres.session import _CUT_AT as CUT_AT
from leaseq.stores.postgres.session import lock_timeout
from leaseq.stores.postgres.watchdog import cut
from tcp_proxy import BlackHoleProxy


def _lose(conn: Any) -> None:
    cut(conn)
    conn.execute("SELECT 1")  # psycopg.OperationalError: the connection is gone


@contextmanager
def after_first_run(store: PostgresStore, method: str, then: Callable[[Any], None],
                    query: str | None = None) -> Iterator[None]:
    """``then(conn)`` once, after the first run of ``store.<method>(conn, ...)`` (of
    ``query`` only, when given: its second argument)."""
    real = getattr(store, method)
    fired = []

    def run_then(conn: Any, *args: Any, **kwargs: Any) -> Any:
        out = real(conn, *args, **kwargs)
        if (query is None or args[0] == query) and not fired:
            fired.append(method)
            then(conn)
        return out

    setattr(store, method, run_then)
    try:
        yield
    finally:
        delattr(store, method)
    assert fired, f"{query or method} never ran"


def answer_lost_once(store: PostgresStore, method: str,
                     query: str | None = None) -> AbstractContextManager[None]:
    """The first run of ``store.<method>(conn, ...)`` commits (autocommitted), then its
    connection is cut before the client reads anything more: the session sees a lost
    connection of unknown outcome."""
    return after_first_run(store, method, _lose, query)


def commit_answer_lost_once(store: PostgresStore, method: str) -> AbstractContextManager[None]:
    """The transaction that ``store.<method>(conn, ...)`` runs in commits, then its connection
    is cut before the client reads the COMMIT's answer."""
    def lose_the_commits_answer(conn: Any) -> None:
        execute = conn.execute

        def execute_then_lost(query: Any, *args: Any, **kwargs: Any) -> Any:
            done = execute(query, *args, **kwargs)
            if query == "COMMIT":
                _lose(conn)
            return done

        conn.execute = execute_then_lost

    return after_first_run(store, method, lose_the_commits_answer)


def _held(store: PostgresStore, queue: str) -> dict[str, int]:
    """The queue's processing jobs and their attempts."""
    return {job.id: job.attempts for job in store.queue(queue).list_jobs("processing")}


def test_a_retried_beat_journals_a_lost_lease_once(store: PostgresStore) -> None:
    # Given a worker holding one lease, and one it lost (the job finished under it)
    q = store.queue("work")
    q.enqueue("held", {})
    q.enqueue("lost", {})
    held, lost = sorted(q.claim("host:1:w1", 2), key=lambda j: j.id != "held")
    q.complete(lost)
    # When a beat of both commits and its answer is lost, so it runs again
    with answer_lost_once(store, "_tuples", "heartbeat"):
        assert q.heartbeat([held, lost]) == ["lost"]
    # Then the lost lease is journaled once
    assert [e.event for e in q.journal("lost")].count("heartbeat_lost") == 1


def test_a_retried_mark_journals_one_publish(store: PostgresStore) -> None:
    # Given a job the broker confirmed
    q = store.queue("work")
    q.enqueue("j1", {})
    confirmed = q.outbox_due()
    dispatcher = Dispatcher([q], "amqp://")
    # When the dispatcher's mark commits and its answer is lost, so it runs again
    with answer_lost_once(store, "_rows", "mark_published"):
        dispatcher._mark(q, confirmed)
    # Then the job is published, and its story tells one publish (the retry marked nothing,
    # and that is no "confirmed after the job moved on")
    assert q.get("j1").published_at is not None  # type: ignore[union-attr]
    published = [e for e in q.journal("j1") if e.event == "published"]
    assert [e.reason for e in published] == [None]


# --- claims -------------------------------------------------------------------------------


def claim_one_of_two_answer_lost(store: PostgresStore) -> list[Job]:
    """Two jobs, j1 and j2, and a claim of one that commits, its answer lost."""
    q = store.queue("work")
    q.enqueue("j1", {})
    q.enqueue("j2", {})
    with answer_lost_once(store, "_tuples", "claim"):
        return q.claim("host:1:w1", 1)


def test_a_claim_whose_answer_was_lost_returns_the_jobs_it_took(store: PostgresStore) -> None:
    # When a claim of one of two jobs commits and its answer is lost, so the session retries
    jobs = claim_one_of_two_answer_lost(store)
    # Then the worker gets the job the lost try took, on its first attempt, and nothing else
    # is held: the retry read it back rather than take another (leaving j1 held by nobody)
    assert [(j.id, j.attempts) for j in jobs] == [("j1", 1)]
    assert _held(store, "work") == {"j1": 1}
    assert [e.event for e in store.queue("work").journal("j1")].count("claimed") == 1


def test_a_claim_of_one_job_whose_answer_was_lost_returns_it(store: PostgresStore) -> None:
    q = store.queue("work")
    q.enqueue("j1", {})
    with answer_lost_once(store, "_pipelined_claim", "claim_one"):
        job = q.claim_one("j1", "host:1:w1")
    # The retry would have found the job processing and returned None
    assert job is not None and (job.id, job.attempts) == ("j1", 1)


def test_a_keyed_claim_whose_answer_was_lost_returns_the_jobs_it_took(
        store: PostgresStore) -> None:
    # Given a key-limited queue with two jobs of one key, one slot each
    q = store.queue("work", key_limit=1)
    q.enqueue("j1", {}, concurrency_key="tenant:1")
    q.enqueue("j2", {}, concurrency_key="tenant:2")
    q.enqueue("j3", {}, concurrency_key="tenant:1")
    # When a keyed claim commits and its answer is lost
    with answer_lost_once(store, "_claim_keyed"):
        jobs = q.claim("host:1:w1", 10)
    # Then the retry returns what it took; it did not take the keys' slots a second time
    # (both full, it would have returned nothing)
    assert sorted(j.id for j in jobs) == ["j1", "j2"]
    assert _held(store, "work") == {"j1": 1, "j2": 1}


def test_a_rate_limited_claim_whose_commit_answer_was_lost_returns_the_jobs_it_took(
        store: PostgresStore) -> None:
    # Given a rate-limited queue with two jobs (its claim is a transaction of several
    # statements, committed at the end)
    q = store.queue("work", rate_per_s=100)
    q.enqueue("j1", {})
    q.enqueue("j2", {})
    # When the claim of one commits and the COMMIT's answer is lost
    with commit_answer_lost_once(store, "_claim_limited"):
        jobs = q.claim("host:1:w1", 1)
    # Then it returns j1, and j2 is still waiting
    assert [j.id for j in jobs] == ["j1"]
    assert _held(store, "work") == {"j1": 1}


def test_a_claim_still_running_when_its_connection_is_cut_is_ended_before_it_is_read_back(
        schema_url: str) -> None:
    # Given a store whose calls are cut after 0.3 s (retried for up to 10 s), and two jobs
    store = PostgresStore.from_url(with_option(schema_url, call_timeout_s=0.3, reconnect_s=10))
    try:
        q = store.queue("work")
        q.enqueue("j1", {})
        q.enqueue("j2", {})
        # ... and a first try of the claim that has taken and locked j1 when it stalls on the
        # server for 5 s before it commits (a slow disk, a stalled network under its answer)
        store.queries = {**store.queries, "claim_stalled": store.queries["claim"].replace(
            "SELECT * FROM taken ORDER BY", "SELECT * FROM taken WHERE pg_sleep(5)::text = '' "
            "ORDER BY")}
        real = store._tuples
        stalled: list[str] = []

        def first_try_stalls(conn: Any, name: str, *args: Any, **kwargs: Any) -> Any:
            if name == "claim" and not stalled:
                stalled.append(name)
                name = "claim_stalled"
            return real(conn, name, *args, **kwargs)

        store._tuples = first_try_stalls  # type: ignore[method-assign]
        # When the worker claims one job: the first try is cut at 0.3 s, its outcome unknown
        started = time.monotonic()
        jobs = q.claim("host:1:w1", 1)
        # Then the retry ended the stalled session (else it would have skipped the locked j1
        # and taken j2, and j1 would have been taken by nobody once the stall ended), found
        # nothing committed, and claimed again: j1, at once rather than after the stall
        assert stalled and [(j.id, j.attempts) for j in jobs] == [("j1", 1)]
        assert time.monotonic() - started < 4
        assert _held(store, "work") == {"j1": 1}
    finally:
        store.close()


def test_a_keyed_claim_waiting_for_the_limits_lock_stops_waiting_at_the_callers_deadline(
        store: PostgresStore, pg_url: str) -> None:
    # Given a key-limited queue with one job, and a session holding the queue's limits lock
    q = store.queue("work", key_limit=2)
    assert q.claim("host:1:w0", 1) == []  # makes the queue's limits row
    q.enqueue("j1", {}, concurrency_key="tenant:1")
    with psycopg.connect(pg_url) as holder:
        holder.execute(store.queries["limit_lock"], {"queue": "work", "off": 0.0})
        # When a claim waits for it with half a second to go
        with pytest.raises(StoreUnavailable), deadline.within(0.5):
            q.claim("host:1:w1", 1)
        # ... and the lock is then given up
        holder.rollback()
    # Then the claim's statement had stopped waiting on the server too: once no session runs
    # it any more, j1 is still pending with no attempt spent (the claim's caller gave up, and
    # a statement that went on waiting would have taken j1 for nobody)
    _until_no_session_works_in(pg_url, store._schema)
    j1 = q.get("j1")
    assert j1 is not None and (j1.status, j1.attempts) == ("pending", 0)


def _until_no_session_works_in(pg_url: str, schema: str) -> None:
    """Wait (at most 10 s) until no other server session runs a statement on ``schema`` or
    is inside a transaction after one."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for _ in range(1000):
            if not conn.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE state <> 'idle' "
                    "AND position(%s in query) > 0 AND pid <> pg_backend_pid()",
                    (schema,)).fetchone():
                return
            threading.Event().wait(0.01)
    raise AssertionError("a session still works in the schema")


def test_through_a_proxy_a_lost_claim_is_read_back_and_no_server_session_is_ended(
        schema_url: str) -> None:
    # Given a store whose connections go through a proxy (as through PgBouncer, which hands
    # a server session to another client once ours has gone), and two jobs
    parts = urlsplit(schema_url)
    proxy = BlackHoleProxy((parts.hostname or "127.0.0.1", parts.port or 5432))
    user = parts.netloc.rpartition("@")[0]
    store = PostgresStore.from_url(urlunsplit(parts._replace(
        netloc=f"{user}@127.0.0.1:{proxy.port}" if user else f"127.0.0.1:{proxy.port}")))
    ended: list[object] = []
    store._session._settle = lambda *args: ended.append(args)  # type: ignore[method-assign]
    try:
        # When a claim of one of two jobs commits and its answer is lost
        jobs = claim_one_of_two_answer_lost(store)
        # Then the retry still reads back what the lost try took, but ends no server session:
        # behind a proxy, the one the lost try used may serve another client by now
        assert [(j.id, j.attempts) for j in jobs] == [("j1", 1)]
        assert ended == []
    finally:
        store.close()
        proxy.close()


def test_a_lost_claims_read_back_hands_out_no_lease_that_ran_out_meanwhile(
        store: PostgresStore) -> None:
    # Given a job, and a claim of it that commits, then its lease runs out (a long outage)
    # before the answer is lost and the session tries again
    q = store.queue("work")
    q.enqueue("j1", {})
    real = store._tuples
    lapsed: list[str] = []

    def committed_lapsed_then_lost(conn: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        out = real(conn, name, *args, **kwargs)
        if name == "claim" and not lapsed:
            lapsed.append(name)
            conn.execute(f"UPDATE {store._schema}.jobs SET lease_until = now() - interval '1 s'")
            _lose(conn)
        return out

    store._tuples = committed_lapsed_then_lost  # type: ignore[method-assign]
    jobs = q.claim("host:1:w1", 1)
    del store._tuples
    # Then the worker does not get the lapsed lease (another worker could claim the job at
    # once, and both would run it): the retry claimed the job again, on a lease of its own
    assert lapsed and [(j.id, j.lease_epoch) for j in jobs] == [("j1", 2)]
    assert q.claim("host:2:w2", 1) == []


def test_a_claim_of_one_job_waiting_for_its_row_lock_stops_waiting_at_the_callers_deadline(
        store: PostgresStore, pg_url: str) -> None:
    # Given a job whose row another session holds locked (a finish or a revision in flight)
    q = store.queue("work")
    q.enqueue("j1", {})
    with psycopg.connect(pg_url) as holder:
        holder.execute(f"SELECT 1 FROM {store._schema}.jobs WHERE id = 'j1' FOR UPDATE")
        # When a claim of it (as a RabbitMQ consumer's) waits with half a second to go
        with pytest.raises(StoreUnavailable), deadline.within(0.5):
            q.claim_one("j1", "host:1:w1")
        holder.rollback()
    # Then its statement had stopped waiting on the server too: j1 was not taken for nobody
    _until_no_session_works_in(pg_url, store._schema)
    j1 = q.get("j1")
    assert j1 is not None and (j1.status, j1.attempts) == ("pending", 0)


def test_a_claim_given_up_while_it_stalls_on_the_server_is_ended_there(
        schema_url: str, pg_url: str) -> None:
    # Given a store whose calls are cut after 0.3 s and whose tries stop after 0.2 s (as the
    # defaults: 30 s and 15 s), and a claim that takes j1, then stalls on the server for 5 s
    store = PostgresStore.from_url(with_option(schema_url, call_timeout_s=0.3,
                                               reconnect_s=0.2))
    try:
        q = store.queue("work")
        q.enqueue("j1", {})
        store.queries = {**store.queries, "claim": store.queries["claim"].replace(
            "SELECT * FROM taken ORDER BY", "SELECT * FROM taken WHERE pg_sleep(5)::text = '' "
            "ORDER BY")}
        # When the claim is cut, past the time its tries may take
        with pytest.raises(StoreUnavailable, match=r"outcome .* is unknown"):
            q.claim("host:1:w1", 1)
        # Then its server session is ended rather than left to commit when the stall ends:
        # once no session works in the schema, j1 is still pending with no attempt spent
        _until_no_session_works_in(pg_url, store._schema)
        j1 = q.get("j1")
        assert j1 is not None and (j1.status, j1.attempts) == ("pending", 0)
    finally:
        store.close()


def test_a_session_whose_role_was_switched_is_not_taken_for_one_it_could_end(
        pg_url: str, schema_url: str) -> None:
    # Given a store that logs in as one role and switches to another (options=-c role=…),
    # which hides the session's start time from itself (and the right to end it)
    suffix = uuid.uuid4().hex[:8]
    app, login = f"lq_app_{suffix}", f"lq_login_{suffix}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {app} NOLOGIN")
        admin.execute(f"CREATE ROLE {login} LOGIN IN ROLE {app}")
        admin.execute(f"GRANT CREATE ON DATABASE {admin.info.dbname} TO {app}")
    parts = urlsplit(schema_url)
    url = urlunsplit(parts._replace(
        netloc=f"{login}@{parts.netloc.rpartition('@')[2]}",
        query=f"{parts.query}&options=-c%20role%3D{app}"))
    try:
        store = PostgresStore.from_url(url)
        try:
            q = store.queue("work")
            q.enqueue("j1", {})
            # Then its connections carry no server session to end (a process id alone could
            # name a later, unrelated session)
            assert store._session.run(lambda conn: getattr(conn, BACKEND, None)) is None
            # ... and a claim whose answer is lost is still read back
            with answer_lost_once(store, "_tuples", "claim"):
                assert [j.id for j in q.claim("host:1:w1", 1)] == ["j1"]
        finally:
            store.drop()
            store.close()
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"REVOKE CREATE ON DATABASE {admin.info.dbname} FROM {app}")
            admin.execute(f"DROP ROLE {login}")
            admin.execute(f"DROP ROLE {app}")


def test_the_lock_wait_of_a_very_long_call_stays_within_what_postgresql_accepts() -> None:
    class Conn:
        pass

    conn = Conn()
    setattr(conn, CUT_AT, time.monotonic() + 3e6)  # call_timeout_s may be any finite number
    assert lock_timeout(conn) == "SET LOCAL lock_timeout = 2147483647"  # type: ignore[arg-type]
