"""PostgreSQL-specific: URL options, connection errors, schema creation and migration races."""

from __future__ import annotations

import threading
from urllib.parse import urlsplit

import psycopg
import pytest

import leaseq.stores
from leaseq.errors import InvalidInput, InvalidURL, StoreUnavailable
from leaseq.stores.postgres import PostgresStore
from leaseq.stores.postgres.options import parse_url
from leaseq.stores.sql import migrations

#: Every migration the store ships, by version.
VERSIONS = [version for version, _, _ in migrations("leaseq.stores.postgres")]


def test_leaseq_options_are_taken_out_of_the_url_and_the_rest_goes_to_libpq() -> None:
    conninfo, options = parse_url(
        "postgresql://app:s3cret@db:5433/jobs?schema=work&pool_max=4&sslmode=disable")
    assert (options.schema, options.pool_max, options.pool_min) == ("work", 4, 1)
    assert "schema=" not in conninfo and "pool_max" not in conninfo
    assert conninfo.startswith("postgresql://app:s3cret@db:5433/jobs?sslmode=disable")


def test_a_url_with_no_host_opens_the_server_its_query_names(schema_url: str) -> None:
    # Given libpq's URL for the local socket or a host in the query: postgresql:///db
    parts = urlsplit(schema_url)
    database = parts.path.lstrip("/")
    url = (f"postgresql:///{database}?host={parts.hostname}&port={parts.port}"
           f"&user={parts.username}&{parts.query}")
    conninfo, _ = parse_url(url)
    assert conninfo.startswith(f"postgresql:///{database}?host=")
    # When a store opens it, Then it reaches that server (libpq refused "postgresql:/db")
    store = PostgresStore.from_url(url)
    try:
        assert store.queue("q").counts() == {}
    finally:
        store.close()


def test_libpq_options_with_spaces_reach_the_server_as_written(schema_url: str) -> None:
    # A space, percent-encoded in the URL, was passed on as "+", which libpq keeps as "+"
    store = PostgresStore.from_url(f"{schema_url}&application_name=billing%20worker"
                          "&options=-c%20statement_timeout%3D4321")
    try:
        got = store._session.run(lambda conn: conn.execute(
            "SELECT current_setting('application_name'), "
            "current_setting('statement_timeout')").fetchone())
        assert got == ("billing worker", "4321ms")
    finally:
        store.close()


@pytest.mark.parametrize("query, words", [
    ("schema=Bad-Name", "schema"),
    ("schema=pg_catalog", "reserved"),
    ("pool_max=zero", "pool_max"),
    ("pool_min=5&pool_max=2", "pool_min"),
])
def test_bad_leaseq_options_are_refused_with_the_password_masked(query: str, words: str) -> None:
    with pytest.raises(InvalidURL, match=words) as info:
        leaseq.stores.connect(f"postgresql://app:s3cret@db/jobs?{query}")
    assert "s3cret" not in str(info.value)
    assert "app:***@db" in str(info.value)


def test_unknown_keyword_option_is_refused() -> None:
    with pytest.raises(InvalidInput, match="pool_size"):
        parse_url("postgresql://db/jobs", pool_size=3)


def test_unreachable_server_is_one_clear_line_without_the_password() -> None:
    with pytest.raises(StoreUnavailable) as info:
        leaseq.stores.connect("postgresql://app:s3cret@127.0.0.1:1/jobs?connect_timeout=2")
    message = str(info.value)
    assert "s3cret" not in message and "\n" not in message
    assert message.startswith("cannot connect to PostgreSQL at postgresql://app:***@127.0.0.1:1")


def test_bad_libpq_option_is_an_invalid_url(pg_url: str) -> None:
    with pytest.raises(InvalidURL, match="no_such_option"):
        leaseq.stores.connect(f"{pg_url}?no_such_option=1")


@pytest.mark.parametrize("query, words", [
    ("sslmode=requir", "invalid sslmode value"),
    ("target_session_attrs=writable", "invalid target_session_attrs value"),
    ("port=abc", 'invalid integer value "abc" for connection option "port"'),
])
def test_a_libpq_option_value_libpq_refuses_is_an_invalid_url(query: str, words: str) -> None:
    # Not StoreUnavailable: libpq refuses it before asking any server, and so would a retry
    with pytest.raises(InvalidURL, match=words) as info:
        leaseq.stores.connect(f"postgresql://app:s3cret@127.0.0.1:5432/test?{query}")
    assert "s3cret" not in str(info.value)


def test_schema_is_created_and_migrated_on_first_use(schema_url: str, pg_url: str) -> None:
    # When a store opens a schema that does not exist yet
    store = PostgresStore.from_url(schema_url)
    try:
        # Then the schema, its tables and its version are there
        assert store.migrate() == VERSIONS[-1]
        with psycopg.connect(pg_url) as conn:
            tables = {r[0] for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                [store.options.schema])}
        assert tables == {"jobs", "journal", "limits", "schedules", "schema_migrations",
                          "workers"}
    finally:
        store.close()


def test_concurrent_first_users_migrate_once(schema_url: str, pg_url: str) -> None:
    # Given eight processes' worth of stores opening one new schema at the same moment
    start = threading.Barrier(8)
    errors: list[BaseException] = []
    stores: list[PostgresStore] = []

    def open_store() -> None:
        start.wait()
        try:
            stores.append(PostgresStore.from_url(schema_url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        # Then every one succeeded and the migration was recorded once
        assert errors == []
        with psycopg.connect(pg_url) as conn:
            rows = conn.execute(
                f'SELECT version FROM "{stores[0].options.schema}".schema_migrations').fetchall()
        assert sorted(rows) == [(v,) for v in VERSIONS]
    finally:
        for store in stores:
            store.close()


def test_drop_removes_the_schema(schema_url: str, pg_url: str) -> None:
    store = PostgresStore.from_url(schema_url)
    store.queue("q").enqueue("j1", {})
    store.drop()
    store.close()
    with psycopg.connect(pg_url) as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                             [store.options.schema]).fetchall()
    assert found == []


def test_payload_text_is_kept_exactly(store: PostgresStore) -> None:
    # NUL escapes and key order survive because payloads are json, not jsonb
    q = store.queue("q")
    q.enqueue("j1", {"b": "\x00", "a": "é"})
    assert q.get("j1").payload == {"a": "é", "b": "\x00"}
    assert q.enqueue("j1", {"b": "\x00", "a": "é"}).outcome == "unchanged"


def test_a_closed_store_refuses_an_enqueue_and_opens_no_pool(schema_url: str) -> None:
    store = PostgresStore.from_url(schema_url)
    store.queue("q").enqueue("j1", {})  # the one-job enqueue runs on the second pool
    store.close()
    with pytest.raises(StoreUnavailable, match=r"not open|closed"):
        store.queue("q").enqueue("j2", {})
    assert store._session._generic_pool is None


def test_a_store_opened_while_the_server_restarts_waits_it_out(
        schema_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a server that is restarting when the store first connects: it says it is shutting
    # down, then refuses the connection (the gap before it is up again), then answers
    real = psycopg.connect
    answers = [psycopg.OperationalError(
                   'connection failed: FATAL:  the database system is shutting down'),
               psycopg.OperationalError('connection failed: Connection refused')]
    tries: list[str] = []

    def restarting_server(*args: object, **kwargs: object) -> psycopg.Connection:
        tries.append("try")
        if answers:
            raise answers.pop(0)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(psycopg, "connect", restarting_server)
    store = PostgresStore.from_url(schema_url)
    try:
        # When it is first used, Then it waits the restart out and migrates
        assert store.migrate() == VERSIONS[-1]
        assert len(tries) >= 3
    finally:
        store.close()


def test_a_refused_connection_with_no_restart_seen_fails_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a server that refuses the connection (no server there: a typo in the port)
    tries: list[str] = []

    def refused(*args: object, **kwargs: object) -> psycopg.Connection:
        tries.append("try")
        raise psycopg.OperationalError("connection failed: Connection refused")

    monkeypatch.setattr(psycopg, "connect", refused)
    # When a store is opened, Then it fails on the first try, not after reconnect_s
    with pytest.raises(StoreUnavailable, match="Connection refused"):
        leaseq.stores.connect("postgresql://app@127.0.0.1:1/jobs?reconnect_s=30")
    assert tries == ["try"]
