"""The MongoDB store's schema version against the recording fake. Store-specific: MongoDB
records no version (its migrate makes indexes, no migrations table), so what the version is
read from is this store's own choice: the journal collection that migrate made."""

from __future__ import annotations

from typing import Any

import pytest
from mongo_fakes import FakeDB
from pymongo.errors import ServerSelectionTimeoutError

from leaseq.errors import StoreUnavailable
from leaseq.stores.mongodb import MongoStore
from leaseq.stores.mongodb.store import SCHEMA_VERSION


class Listing(FakeDB):
    """A fake whose collection listing honours the name filter and counts its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.filters: list[Any] = []

    def list_collection_names(self, filter: Any = None) -> list[str]:
        self.filters.append(filter)
        wanted = (filter or {}).get("name")
        return [n for n in self.names if not isinstance(wanted, str) or n == wanted]


def test_the_version_is_the_codes_once_the_journal_collection_exists() -> None:
    # Given a database where migrate made the journal collection
    db = Listing()
    store = MongoStore(db, prefix="app_")
    db.names = ["app_journal", "app_q"]
    calls = len(db.calls)
    # When the version is read
    version = store.schema_version()
    # Then it was asked by name and sent nothing else (no index made, nothing written)
    assert db.filters[-1] == {"name": "app_journal"}
    assert db.calls[calls:] == []
    # And it is the one migrate returns
    assert version == SCHEMA_VERSION == store.migrate()


def test_no_version_where_no_journal_collection_exists() -> None:
    # Given a database with another prefix's journal only (never migrated for this one)
    db = Listing()
    store = MongoStore(db, prefix="app_")
    db.names = ["other_journal"]
    calls = len(db.calls)
    # When the version is read  Then there is none, and reading it made nothing
    assert store.schema_version() is None
    assert db.calls[calls:] == []


def test_an_unreachable_server_is_store_unavailable(db: FakeDB) -> None:
    store = MongoStore(db)

    def down(filter: Any = None) -> list[str]:
        raise ServerSelectionTimeoutError("no servers")

    db.list_collection_names = down  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable):
        store.schema_version()
