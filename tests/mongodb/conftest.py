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
    for collection, method, query, sort in queries(db):
        served_by = (journal if collection.endswith("journal")
                     else workers if collection.endswith("__workers") else job)
        missing = indexes.unserved(query, sort, served_by)
        assert not missing, f"no index serves {query} sorted by {sort} on {collection}"
        # Neither filtered nor sorted: every job of the queue is read (and the checker's rule,
        # which asks nothing of such a query, would call it served). Not the limits (a
        # document per queue), nor a find_one (it reads one).
        scans_jobs = (served_by is job and not collection.endswith("limits")
                      and method != "find_one" and not query and not sort)
        assert not scans_jobs, f"a query reads every job of {collection}"


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
