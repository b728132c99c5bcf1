"""The async API's stores: SQLite (a file, so a second connection can see it) and PostgreSQL
(a fresh schema per test, skipped with the reason when the server cannot be reached)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from leaseq.stores import connect
from leaseq.stores.base import Store
from leaseq.validate import redact_url

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


def postgres_url() -> str:
    """The shared server's URL, or a skip saying why it cannot be used."""
    psycopg = pytest.importorskip("psycopg", reason="leaseq[postgres] is not installed")
    url = os.environ.get("LEASEQ_TEST_POSTGRES_URL") or DEFAULT_POSTGRES_URL
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL not reachable at {redact_url(url)}: "
                    f"{str(exc).splitlines()[0] if str(exc) else exc!r}")
    return url


@pytest.fixture
def pg_store_url() -> Iterator[str]:
    """A PostgreSQL store URL with a fresh schema, dropped after the test."""
    base = postgres_url()
    url = f"{base}{'&' if '?' in base else '?'}schema=aio_{uuid.uuid4().hex[:12]}"
    yield url
    with connect(url) as store:
        store.drop()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'jobs.db'}"
        return
    base = postgres_url()
    url = f"{base}{'&' if '?' in base else '?'}schema=aio_{uuid.uuid4().hex[:12]}"
    yield url
    with connect(url) as store:
        store.drop()


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with connect(store_url) as opened:
        yield opened
