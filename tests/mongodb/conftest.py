"""Fixtures of the MongoDB store's unit tests. Every test is also an index test: when it ends,
every query the store sent to any fake database in it must be served by one of the store's
indexes (the ESR rule, ``leaseq.stores.mongodb.indexes``), so a new query shape without an
index fails the test that first sends it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mongo_fakes import MADE, FakeDB, queries

from leaseq.stores.mongodb import MongoStore, indexes


def assert_indexed(db: FakeDB) -> None:
    job = [keys for keys, _ in indexes.job_indexes({})]
    journal = [keys for keys, _ in indexes.journal_indexes()]
    workers = [[("last_beat_at", 1)]]
    for collection, query, sort in queries(db):
        served_by = (journal if collection.endswith("journal")
                     else workers if collection.endswith("__workers") else job)
        missing = indexes.unserved(query, sort, served_by)
        assert not missing, f"no index serves {query} sorted by {sort} on {collection}"


@pytest.fixture(autouse=True)
def every_query_is_indexed() -> Iterator[None]:
    MADE.clear()
    yield
    for fake in MADE:
        assert_indexed(fake)


@pytest.fixture
def db() -> FakeDB:
    return FakeDB()


@pytest.fixture
def store(db: FakeDB) -> MongoStore:
    return MongoStore(db, url="mongodb://u:s3cret@db.example/leaseq")
