"""The MongoDB store opened with ``create=False`` against the recording fake: no collection,
no index made, none dropped. Store-specific: MongoDB makes a collection by writing to it and
keeps leaseq's indexes per queue, made on first use; a reader must do neither (no MongoDB
server runs where the conformance suite runs here)."""

from __future__ import annotations

from unittest import mock

import pytest
from mongo_fakes import INDEX_SET_UP, FakeDB

from leaseq.errors import StoreNotFound
from leaseq.stores.mongodb import MongoStore
from leaseq.stores.mongodb.connection import parse_url

URL = "mongodb://u:s3cret@db.example/leaseq"


def index_calls(db: FakeDB) -> list[str]:
    return [f"{c}.{m}" for c, m, _, _ in db.calls if m in INDEX_SET_UP]


def test_a_database_without_the_journal_is_not_found_and_gets_nothing() -> None:
    # Given a database where leaseq never ran (another prefix's journal only)
    db = FakeDB()
    db.names = ["other_journal"]
    # When it is opened with create=False
    with pytest.raises(StoreNotFound) as refused:
        MongoStore(db, url=URL, create=False)
    # Then the error names it, password masked, and nothing was sent but reads
    message = str(refused.value)
    assert "db.example/leaseq" in message and "s3cret" not in message
    assert db.calls == [] and db.commands == []


def test_a_reader_makes_no_index_and_drops_none() -> None:
    # Given a leaseq database whose workers keep a TTL the reader's URL does not name
    db = FakeDB()
    db.names = ["leaseq_journal", "leaseq_q"]
    db["leaseq_q"].answer("list_indexes", [{"name": "leaseq_ttl_done"}])
    store = MongoStore(db, url=URL, create=False)
    # When it reads a queue, a queue that does not exist, and the workers
    store.counts("q")
    store.counts("typo")
    store.list_workers()
    # Then no index was made, listed or dropped, on any collection
    assert index_calls(db) == []
    assert [c for c, m, _, _ in db.calls] == ["leaseq_q", "leaseq_typo", "leaseq__workers"]


def test_migrate_makes_a_reader_index_what_it_opened() -> None:
    # Given a reader that has read a queue (its collection opened unindexed)
    db = FakeDB()
    db.names = ["leaseq_journal", "leaseq_q"]
    store = MongoStore(db, create=False)
    store.counts("q")
    # When it is asked to migrate after all, Then the journal's indexes are made, and the
    # queue's and the workers' at their next use, as on a store opened with create
    store.migrate()
    assert "leaseq_journal.create_index" in index_calls(db)
    store.counts("q")
    store.list_workers()
    assert {"leaseq_q.create_index", "leaseq__workers.create_index"} <= set(index_calls(db))


def test_from_url_takes_create() -> None:
    db = FakeDB()
    client = mock.MagicMock()
    client.__getitem__.return_value = db
    opened = (parse_url("mongodb://h/jobs"), client)
    with mock.patch("leaseq.stores.mongodb.store.open_client", return_value=opened), \
            pytest.raises(StoreNotFound):
        MongoStore.from_url("mongodb://h/jobs", create=False)
    assert client.close.called and index_calls(db) == []
