"""``django://ALIAS``: enqueue inside ``transaction.atomic()`` commits or rolls back with the
caller's transaction, on PostgreSQL and on SQLite (real databases through pytest-django)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.db import connections, transaction
from djangotest_helpers import aliases

from leaseq import App, JobConflict, StoreUnavailable
from leaseq.stores import connect
from leaseq.stores.watch import NotifyWatch

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"]
                                   if "pg" in aliases() else ["default"])


@pytest.fixture(params=aliases())
def alias(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def app(alias: str) -> Iterator[App]:
    app = App(url=f"django://{alias}")

    @app.task(queue="mail")
    def send_mail(to: str) -> None: ...

    yield app
    if app.has_open_store():
        app.store.close()  # its LISTEN connection, so the test database can be dropped


def _listen(alias: str):  # a LISTEN connection of its own, on the test database
    import psycopg

    from leaseq.contrib.django.postgres import alias_conninfo

    conn = psycopg.connect(alias_conninfo(alias), autocommit=True)
    conn.execute("LISTEN leaseq_leaseq")
    return conn


def _notes(conn) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=0.3, stop_after=None)]


def test_commit_keeps_the_job(app: App, alias: str) -> None:
    listener = _listen(alias) if alias == "pg" else None
    with transaction.atomic(using=alias):
        app.enqueue("send_mail", {"to": "a@example.com"}, job_id="j1")
        assert app.queue("mail").get("j1") is not None  # the caller's own transaction sees it
    assert app.queue("mail").get("j1").status == "pending"  # type: ignore[union-attr]
    if listener is not None:  # the NOTIFY went out with the commit
        assert "mail" in _notes(listener)
        listener.close()


def test_an_exception_inside_atomic_leaves_no_job_and_no_notify(app: App, alias: str) -> None:
    listener = _listen(alias) if alias == "pg" else None
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        app.enqueue("send_mail", {"to": "a@example.com"}, job_id="j1")
        raise RuntimeError("the business write failed")
    assert app.queue("mail").get("j1") is None
    if listener is not None:
        assert _notes(listener) == []
        listener.close()


def test_a_conflict_inside_atomic_leaves_the_transaction_usable(app: App, alias: str) -> None:
    with transaction.atomic(using=alias):
        app.enqueue("send_mail", {"to": "a@example.com"}, job_id="j1")
        with pytest.raises(JobConflict):
            app.enqueue("send_mail", {"to": "someone-else@example.com"}, job_id="j1")
        with connections[alias].cursor() as cursor:  # the caller's next query succeeds
            cursor.execute("SELECT 41 + 1")
            assert cursor.fetchone() == (42,)
    job = app.queue("mail").get("j1")
    assert job is not None and job.payload == {"to": "a@example.com"}


def test_async_view_enqueue_joins_the_transaction_on_djangos_thread(app: App,
                                                                     alias: str) -> None:
    @sync_to_async(thread_sensitive=True)
    def place(job_id: str, fail: bool) -> None:
        with transaction.atomic(using=alias):
            app.enqueue("send_mail", {"to": "a@example.com"}, job_id=job_id)
            if fail:
                raise RuntimeError("rolled back")

    async def view() -> None:
        await place("kept", False)
        with pytest.raises(RuntimeError):
            await place("gone", True)
        # aenqueue on a django:// store runs on the same thread, in autocommit
        await app.get_task("send_mail").aenqueue("b@example.com", job_id="async")  # type: ignore[union-attr]
        # Django's sync thread keeps its connections: close them, as a request's end would
        await sync_to_async(connections.close_all, thread_sensitive=True)()

    asyncio.run(view())
    q = app.queue("mail")
    assert q.get("kept") is not None and q.get("gone") is None and q.get("async") is not None


def test_worker_operations_and_wait_run_on_djangos_connection(
        app: App, alias: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # PostgreSQL's watch would read the job again every second: made longer than the wait, so
    # only the finish's NOTIFY (SQLite: its change counter) can wake it in time
    monkeypatch.setattr(NotifyWatch, "poll_s", 60.0)
    q = app.queue("mail")
    q.enqueue("j1", {"to": "x"}, task="send_mail")
    job = q.claim("w1")[0]

    def finish() -> None:  # another thread: another Django connection, as a worker's
        time.sleep(0.3)
        q.complete(job, {"ok": True})
        connections.close_all()

    finisher = threading.Thread(target=finish)
    finisher.start()
    done = q.wait("j1", timeout_s=10)  # woken by NOTIFY / the counter
    finisher.join()
    assert done.result == {"ok": True}
    assert [e.event for e in q.journal("j1")] == ["enqueued", "claimed", "result_saved"]


def test_an_async_call_that_cannot_connect_raises_store_unavailable(app: App,
                                                                    alias: str) -> None:
    # Given a django:// PostgreSQL store whose own async connections cannot reach the server
    if alias != "pg":
        pytest.skip("the async connections of their own are PostgreSQL's")
    store = app.store
    store._async._conninfo = "host=127.0.0.1 port=1 connect_timeout=2"  # type: ignore[attr-defined]
    # When an async call needs one
    # Then it says the store is unavailable, as every store does (not an AttributeError)
    with pytest.raises(StoreUnavailable, match="unavailable"):
        asyncio.run(store.aget("mail", "any"))


@pytest.mark.parametrize(("statement", "error", "words"), [
    # over one of the server's limits (54000, which psycopg makes an OperationalError)
    ("SELECT repeat('x', 1 << 30)", "InvalidInput", "over one of its limits: requested length"),
    # a table the schema does not hold (42P01)
    ("SELECT * FROM no_such_table_here", "StoreRefused", "does not exist"),
], ids=["over-a-limit", "table-gone"])
def test_a_statement_the_server_refuses_for_good_is_typed_at_once(
        app: App, alias: str, statement: str, error: str, words: str) -> None:
    # Given a django:// PostgreSQL store
    if alias != "pg":
        pytest.skip("the SQLSTATEs are PostgreSQL's")
    import leaseq.errors

    store = app.store
    # When a statement is refused in a way no retry gets past
    with pytest.raises(getattr(leaseq.errors, error), match=words):
        store._session.run(  # type: ignore[attr-defined]
            lambda conn: conn.execute(statement).fetchone())
    # Then it is typed (not an unavailable server, not psycopg's own error), and the next
    # call works
    assert store.counts("mail") == {}


def test_django_urls_are_checked() -> None:
    from leaseq.errors import InvalidURL

    with pytest.raises(InvalidURL, match="no such database alias"):
        connect("django://nope")
    with pytest.raises(InvalidURL, match="looks like"):
        connect(f"django://default/{uuid.uuid4().hex}")


def test_a_django_url_without_django_settings_says_what_to_do() -> None:
    import subprocess
    import sys

    code = ("import leaseq\ntry:\n    leaseq.connect('django://default')\n"
            "except leaseq.InvalidURL as exc:\n    print(exc)\n")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60).stdout
    assert "django:// needs Django's settings" in out


@pytest.mark.parametrize("limits", [{"key_limit": 1}, {"rate_per_s": 1}])
def test_a_limited_queue_claims_on_a_django_store(app: App, limits: dict[str, int]) -> None:
    # Given a queue with a key limit (or a rate limit) on the django:// store
    app.configure_queue("lim", limits)
    q = app.queue("lim")
    q.enqueue("a", {}, task="t", concurrency_key="k")
    q.enqueue("b", {}, task="t", concurrency_key="k")
    # When a worker claims all it may
    # Then the limit holds one of them back (the SQLite store's limit state is set on
    # django:// too: an AttributeError killed the worker there)
    assert [job.id for job in q.claim("w1", 5)] == ["a"]


def test_a_store_opened_inside_atomic_holds_no_lock_past_its_migration(alias: str) -> None:
    # Given a django:// PostgreSQL store opened inside a transaction that stays open
    if alias != "pg":
        pytest.skip("the migration's advisory lock is PostgreSQL's")
    opened: list[float] = []

    def open_elsewhere() -> None:  # another thread: another Django connection
        started = time.monotonic()
        connect(f"django://{alias}").close()
        opened.append(time.monotonic() - started)
        connections.close_all()

    with transaction.atomic(using=alias):
        connect(f"django://{alias}").close()
        # When another connection opens the store meanwhile
        other = threading.Thread(target=open_elsewhere)
        other.start()
        other.join(timeout=5)
        # Then it does not wait for this transaction (the migration committed on its own)
        assert opened, "the other open waited for the caller's transaction"
    other.join()


def test_leaseqs_own_connections_keep_every_libpq_setting_of_the_alias(
        alias: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given an alias whose OPTIONS set libpq keywords beyond the usual ones
    if alias != "pg":
        pytest.skip("leaseq's own connections are PostgreSQL's")
    from psycopg.conninfo import conninfo_to_dict

    from leaseq.contrib.django.postgres import alias_conninfo

    options = connections[alias].settings_dict.setdefault("OPTIONS", {})
    for key, value in {"application_name": "shop", "channel_binding": "prefer",
                       "keepalives_idle": "30"}.items():
        monkeypatch.setitem(options, key, value)
    # When leaseq builds the conninfo of its own connections
    built = conninfo_to_dict(alias_conninfo(alias))
    # Then the alias's settings are kept, leaseq's defaults fill the rest, Django's own go
    assert (built["application_name"], built["channel_binding"], built["keepalives_idle"]) == (
        "shop", "prefer", "30")
    assert built["connect_timeout"] == "10" and built["keepalives"] == "1"
    assert built["dbname"] == connections[alias].settings_dict["NAME"]
    assert not {"cursor_factory", "context", "prepare_threshold"} & set(built)


@pytest.mark.skipif("pg" not in aliases(), reason="the key-limited claim's one round trip is "
                    "PostgreSQL's")
def test_a_key_limited_claim_inside_atomic_joins_the_callers_transaction() -> None:
    # Given a key-limited queue on the django:// PostgreSQL store, with a job
    with connect("django://pg") as store:
        q = store.queue("keyed", key_limit=2)
        q.enqueue("j1", {}, concurrency_key="tenant:1")
        # When a caller's atomic() claims it (run_jobs in a TestCase does) and then rolls back
        with pytest.raises(RuntimeError, match="roll back"), transaction.atomic(using="pg"):
            [job] = q.claim("w1", 2)
            assert job.id == "j1"
            raise RuntimeError("roll back")
        # Then the claim was part of that transaction: the job is pending again, not left
        # processing by a COMMIT of the claim's own that ended the caller's transaction
        assert store.get("keyed", "j1").status == "pending"  # type: ignore[union-attr]


@pytest.fixture
def reroute() -> Iterator[Callable[..., None]]:
    """``reroute(alias, **settings)``: ``alias``'s next connection is opened with ``settings``
    changed, for this test only (an alias added at run time would be one the test may not
    use). Put back here, not by ``monkeypatch``: before the tables are emptied."""
    saved: list[tuple[str, dict[str, object]]] = []

    def reroute(alias: str, **changes: object) -> None:
        settings = connections[alias].settings_dict
        saved.append((alias, {key: settings[key] for key in changes}))
        settings.update(changes)

    yield reroute
    for alias, before in reversed(saved):
        connections[alias].close()
        connections[alias].settings_dict.update(before)


def _closed_port() -> int:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as listener:
        return int(listener.getsockname()[1])


def test_a_store_on_an_unreachable_database_is_unavailable(
        alias: str, reroute: Callable[..., None], tmp_path: Path) -> None:
    # Given an alias whose database cannot be reached (a closed port; a file in no folder)
    connections[alias].close()
    reroute(alias, **{"PORT": str(_closed_port())} if alias == "pg" else {
        "NAME": str(tmp_path / "no-such-folder" / "db.sqlite3")})
    # When a store is opened on it
    # Then it says the store is unavailable (leaseq's error, not Django's OperationalError)
    with pytest.raises(StoreUnavailable, match=f"django://{alias} is unavailable"):
        connect(f"django://{alias}")


@pytest.mark.skipif("pg" not in aliases(), reason="a server to lose is PostgreSQL's")
def test_every_call_after_the_server_went_away_is_unavailable(
        reroute: Callable[..., None]) -> None:
    import psycopg

    from leaseq.contrib.django.postgres import alias_conninfo

    # Given a django:// PostgreSQL store in use
    store = connect("django://pg")
    try:
        queue = store.queue("mail")
        assert queue.claim("w1") == []
        # When the server goes away: it ends this connection, and refuses new ones
        backend = connections["pg"].connection.info.backend_pid
        with psycopg.connect(alias_conninfo("pg"), autocommit=True) as admin:
            reroute("pg", PORT=str(_closed_port()))
            admin.execute("SELECT pg_terminate_backend(%s)", [backend])
        # Then the call that meets the lost connection and the next one, which finds none
        # (Django's reconnect raises Django's own OperationalError), are both unavailable:
        # a worker's claim round goes on after them
        for _ in range(2):
            with pytest.raises(StoreUnavailable, match="django://pg is unavailable"):
                queue.claim("w1")
    finally:
        store.close()


@pytest.mark.skipif("pg" not in aliases(), reason="only the PostgreSQL store takes options")
def test_a_django_url_takes_leaseqs_options_only_each_decoded_once() -> None:
    from leaseq.errors import InvalidURL

    # Given django:// URLs with a mistyped option, a libpq keyword, and an encoded "&"
    # When they are opened
    # Then the keys that would do nothing are refused, and the "&" stays in the value
    with pytest.raises(InvalidURL, match=r"unknown option\(s\) schem; known: .*schema"):
        connect("django://pg?schem=x")
    with pytest.raises(InvalidURL, match=r"unknown option\(s\) connect_timeout"):
        connect("django://pg?connect_timeout=5")
    with pytest.raises(InvalidURL, match="schema"):
        connect("django://pg?schema=leaseq%26x")
    with connect("django://pg?pool_max=3&schema=leaseq") as store:
        assert (store.options.pool_max, store.options.schema) == (3, "leaseq")  # type: ignore[attr-defined]
