"""PostgreSQL-specific: no call waits without a bound (issue 14).

A call that does not answer (here: a server-side sleep standing in for a black-holed network,
where ``statement_timeout`` would never be seen) is cut from the client at ``call_timeout_s``
or at the caller's ``leaseq.deadline``, whichever comes first.
"""

from __future__ import annotations

import time

import pytest
from pg_urls import with_option

from leaseq import deadline
from leaseq.errors import InvalidURL, StoreUnavailable
from leaseq.stores.postgres import PostgresStore
from leaseq.stores.postgres.options import LIBPQ_DEFAULTS, parse_url


def _sleep(seconds: float):  # type: ignore[no-untyped-def]
    return lambda conn: conn.execute("SELECT pg_sleep(%s)", (seconds,)).fetchall()


def test_libpq_gets_keepalives_and_a_tcp_user_timeout_unless_the_url_sets_them() -> None:
    conninfo, options = parse_url("postgresql://db/jobs?tcp_user_timeout=3000")
    assert "tcp_user_timeout=3000" in conninfo and "tcp_user_timeout=10000" not in conninfo
    assert "keepalives=1" in conninfo and "keepalives_idle=5" in conninfo
    assert set(LIBPQ_DEFAULTS) >= {"keepalives_interval", "keepalives_count", "connect_timeout"}
    assert (options.call_timeout_s, options.idle_in_transaction_s) == (30.0, 60.0)


@pytest.mark.parametrize("query", ["call_timeout_s=0", "call_timeout_s=x",
                                   "idle_in_transaction_s=-1", "call_timeout_s=inf"])
def test_a_bound_that_is_not_a_positive_number_is_refused(query: str) -> None:
    with pytest.raises(InvalidURL, match=query.split("=")[0]):
        parse_url(f"postgresql://db/jobs?{query}")


def test_the_server_ends_a_session_idle_in_a_transaction(schema_url: str) -> None:
    # Given a store whose sessions may idle in a transaction for 200 ms at most
    store = PostgresStore.from_url(with_option(schema_url, idle_in_transaction_s=0.2))
    try:
        store.migrate()
        shown = store._session.run(
            lambda conn: conn.execute("SHOW idle_in_transaction_session_timeout").fetchone())
        # Then each pool connection carries the setting
        assert shown == ("200ms",)
    finally:
        store.close()


def test_a_call_that_never_answers_is_cut_at_call_timeout(schema_url: str) -> None:
    # Given a store whose calls may take 0.3 s and whose retries stop after 1 s
    store = PostgresStore.from_url(with_option(schema_url, call_timeout_s=0.3, reconnect_s=1))
    try:
        store.migrate()
        started = time.monotonic()
        # When a read waits on a server that does not answer for 20 s
        with pytest.raises(StoreUnavailable, match="unavailable"):
            store._session.run(_sleep(20), idempotent=True, autocommit=True)
        # Then it gave up within its bounds (about 1.3 s), not after 20 s, and the cut was the
        # watchdog's (the bound leaves a busy machine its scheduling)
        assert time.monotonic() - started < 8
        assert store._session.watchdog.cuts >= 2
        # And the store works again at once
        assert store.counts("q") == {}
    finally:
        store.close()


def test_a_callers_deadline_is_shorter_than_the_stores_bounds(schema_url: str) -> None:
    store = PostgresStore.from_url(schema_url)  # call_timeout_s 30 s, reconnect_s 15 s
    try:
        store.migrate()
        started = time.monotonic()
        with deadline.within(0.4), pytest.raises(StoreUnavailable, match="caller's deadline"):
            store._session.run(_sleep(20), idempotent=True, autocommit=True)
        assert time.monotonic() - started < 8  # 0.4 s: not the store's 15 s or the sleep's 20
    finally:
        store.close()


def test_a_write_cut_by_its_deadline_has_an_unknown_outcome_and_is_not_retried(
        schema_url: str) -> None:
    store = PostgresStore.from_url(with_option(schema_url, call_timeout_s=0.3, reconnect_s=5))
    try:
        store.migrate()
        started = time.monotonic()
        # When a write (not safe to repeat) is cut while the server works on it
        with pytest.raises(StoreUnavailable, match="outcome is unknown"):
            store._session.run(_sleep(20), autocommit=True)
        # Then it is reported at once as unknown (0.3 s), never repeated for the 5 s of
        # reconnect_s nor assumed done
        assert time.monotonic() - started < 4
    finally:
        store.close()


def test_the_watchdog_leaves_calls_that_finish_in_time_alone(schema_url: str) -> None:
    store = PostgresStore.from_url(with_option(schema_url, call_timeout_s=2))
    try:
        store.migrate()
        for _ in range(20):
            store._session.run(_sleep(0), idempotent=True, autocommit=True)
        assert store._session.watchdog.cuts == 0
    finally:
        store.close()
