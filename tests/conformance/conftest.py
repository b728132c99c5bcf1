"""Binds the conformance suite to leaseq's own stores: ``-k sqlite``, ``-k postgres``,
``-k mongodb`` pick one. Every store lists the same tests; a store that cannot run here is
skipped with its reason, never left out."""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest

from leaseq.stores import connect
from leaseq.testing import FreshStore, fresh_store  # its asserts rewritten: see tests/conftest.py
from leaseq.validate import redact_url

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _with_option(url: str, key: str, value: str) -> str:
    return f"{url}{'&' if urlsplit(url).query else '?'}{key}={value}"


def _unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


@contextmanager
def sqlite_transaction(path: str) -> Iterator[sqlite3.Connection]:
    """The caller's own connection to the database file, in a write transaction."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    finally:
        conn.close()


@contextmanager
def postgres_transaction(url: str) -> Iterator[Any]:
    """The caller's own psycopg connection, in a transaction (leaseq's URL options dropped)."""
    import psycopg

    from leaseq.stores.postgres.options import parse_url

    conninfo, _ = parse_url(url)
    with psycopg.connect(conninfo) as conn:  # commits on a clean exit, else rolls back
        yield conn


@contextmanager
def mongodb_transaction(url: str) -> Iterator[Any]:
    """The caller's own session, inside a transaction (replica set or mongos only)."""
    from leaseq.stores.mongodb.connection import open_client

    _, client = open_client(url)
    try:
        with client.start_session() as session, session.start_transaction():
            yield session
    finally:
        client.close()


class SQLiteFactory:
    """A database file in its own temporary folder."""

    def create(self) -> FreshStore:
        folder = tempfile.mkdtemp(prefix="leaseq-conformance-")
        path = os.path.join(folder, "jobs.db")
        url = "sqlite:///" + path
        return FreshStore(connect(url), url, transaction=lambda: sqlite_transaction(path))

    def destroy(self, fresh: FreshStore) -> None:
        fresh.store.close()
        shutil.rmtree(os.path.dirname(urlsplit(fresh.url).path[1:]), ignore_errors=True)


class URLFactory:
    """A server store: its own schema / collection prefix, named in the URL; dropped after."""

    def __init__(self, base_url: str, option: str,
                 transaction: Callable[[str], AbstractContextManager[Any]]):
        self.base_url = base_url
        self.option = option
        self.transaction = transaction

    def create(self) -> FreshStore:
        url = _with_option(self.base_url, self.option, _unique("lq_test_"))
        return FreshStore(connect(url), url, transaction=lambda: self.transaction(url))

    def destroy(self, fresh: FreshStore) -> None:
        try:
            fresh.store.drop()
        finally:
            fresh.store.close()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The base URL, once per run; every postgres test is skipped when nothing listens."""
    url = os.environ.get("LEASEQ_TEST_POSTGRES_URL") or DEFAULT_POSTGRES_URL
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5432), 3).close()
    except OSError as exc:
        pytest.skip(f"PostgreSQL not reachable at {redact_url(url)}: {exc}")
    return url


@pytest.fixture(scope="session")
def mongodb_url() -> str:
    url = os.environ.get("LEASEQ_TEST_MONGODB_URL")
    if not url:
        pytest.skip("LEASEQ_TEST_MONGODB_URL not set")
    return url


@pytest.fixture(
    params=[
        pytest.param("sqlite"),
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mongodb", marks=pytest.mark.mongodb),
    ]
)
def leaseq_store(request: pytest.FixtureRequest) -> Iterator[FreshStore]:
    """A fresh, empty store of each kind, for one test."""
    if request.param == "sqlite":
        factory: SQLiteFactory | URLFactory = SQLiteFactory()
    elif request.param == "postgres":
        factory = URLFactory(request.getfixturevalue("postgres_url"), "schema",
                             postgres_transaction)
    else:
        factory = URLFactory(request.getfixturevalue("mongodb_url"), "prefix",
                             mongodb_transaction)
    with fresh_store(factory) as fresh:
        yield fresh
