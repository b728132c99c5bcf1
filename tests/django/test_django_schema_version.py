"""``schema_version`` on Django's borrowed connection: readable inside the caller's
``transaction.atomic()`` (where the SQLite store refuses to migrate), leaving that
transaction usable. Django-specific: the conformance suite opens stores of its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connections, transaction
from djangotest_helpers import aliases

from leaseq.errors import StoreNotFound, StoreNotMigrated
from leaseq.stores import connect
from leaseq.stores.base import Store
from leaseq.stores.sql import migrations

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"]
                                   if "pg" in aliases() else ["default"])
PACKAGES = {"default": "leaseq.stores.sqlite", "pg": "leaseq.stores.postgres"}


@pytest.fixture(params=aliases())
def alias(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def store(alias: str) -> Iterator[Store]:
    store = connect(f"django://{alias}")
    yield store
    store.close()


def test_schema_version_is_read_inside_the_callers_transaction(store: Store,
                                                               alias: str) -> None:
    latest = migrations(PACKAGES[alias])[-1][0]
    assert store.schema_version() == store.migrate() == latest
    with transaction.atomic(using=alias):
        store.queue("mail").enqueue("j1", {})
        assert store.schema_version() == latest
        # the transaction is still usable after the read
        assert store.queue("mail").counts() == {"pending": 1}
    assert store.queue("mail").counts() == {"pending": 1}


def test_create_false_reads_the_tables_django_made_and_makes_none(store: Store,
                                                                   alias: str) -> None:
    # Given the tables Django's migration made, holding a job
    store.queue("mail").enqueue("j1", {})
    # When the alias is opened with create=False, Then it reads them
    with connect(f"django://{alias}", create=False) as reader:
        assert reader.queue("mail").counts() == {"pending": 1}
    # And where they are gone, it refuses and makes none (then they are made again)
    store.drop()
    try:
        with pytest.raises(StoreNotFound, match=f"django://{alias}"):
            connect(f"django://{alias}", create=False)
        assert store.schema_version() is None
    finally:
        store.migrate()


def test_an_older_sqlite_schema_opened_inside_atomic_is_refused_at_once() -> None:
    # Given the SQLite alias's schema one migration behind this leaseq (an upgrade whose
    # manage.py leaseq_migrate has not run yet)
    latest = migrations(PACKAGES["default"])[-1]
    connect("django://default").close()
    with connections["default"].cursor() as cursor:
        cursor.execute("DELETE FROM leaseq_schema WHERE version = %s", [latest[0]])
    try:
        # When a request under ATOMIC_REQUESTS opens the store
        with transaction.atomic(using="default"), pytest.raises(StoreNotMigrated) as refused:
            connect("django://default")
        # Then it is told at once, not by a claim failing later on a missing column
        assert "leaseq migrate" in str(refused.value)
    finally:
        with connections["default"].cursor() as cursor:
            cursor.execute("INSERT INTO leaseq_schema VALUES (%s, %s, 0)", list(latest[:2]))
