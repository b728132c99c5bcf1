"""``schema_version`` on Django's borrowed connection: readable inside the caller's
``transaction.atomic()`` (where the SQLite store refuses to migrate), leaving that
transaction usable. Django-specific: the conformance suite opens stores of its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import transaction
from djangotest_helpers import aliases

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
