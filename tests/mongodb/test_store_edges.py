"""The MongoDB store's less travelled paths against the recording fake: refused sessions, a
conflict inside a transaction, a racing upsert, index errors, a purge that deletes nothing,
and URL edge cases. Store-specific: these paths are pymongo's, not the protocol's."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import pytest
from mongo_fakes import REPLICA_SET, Deleted, FakeDB
from pymongo.client_session import ClientSession
from pymongo.errors import ConfigurationError, DocumentTooLarge, DuplicateKeyError, OperationFailure

from leaseq.errors import (
    InvalidInput,
    InvalidPayload,
    InvalidPolicy,
    InvalidURL,
    JobConflict,
    StoreRefused,
)
from leaseq.job import EnqueueOutcome, JobSpec, Lease
from leaseq.stores.mongodb import MongoStore, connection, upserts

Q = "leaseq_q"


def spec(job_id: str, payload: dict[str, Any]) -> JobSpec:
    return JobSpec(job_id, payload, json.dumps(payload, sort_keys=True, separators=(",", ":")))


def test_an_index_error_other_than_exists_is_raised(db):
    db[Q].answer("create_index", OperationFailure("no space", code=67))
    store = MongoStore(db)
    with pytest.raises(OperationFailure):
        store.get("q", "a")


def test_enqueue_through_something_that_is_not_a_session_is_refused(store):
    with pytest.raises(TypeError, match="ClientSession"):
        store.enqueue_many("q", [spec("a", {"x": 1})], connection=object())


def test_enqueue_through_a_session_outside_a_transaction_is_refused():
    store = MongoStore(FakeDB(dict(REPLICA_SET)))
    session = mock.MagicMock(spec=ClientSession, in_transaction=False)
    with pytest.raises(InvalidInput, match="inside a transaction"):
        store.enqueue_many("q", [spec("a", {"x": 1})], connection=session)


def test_a_conflict_in_a_transaction_raises_after_the_batch_so_the_transaction_aborts():
    # Given a replica set (no pre-read) and a stored job the batch would change
    db = FakeDB(dict(REPLICA_SET))
    db[Q].answer("find_one_and_update", {"_id": "b", "status": "done", "x": 1})
    store = MongoStore(db)
    with pytest.raises(JobConflict):
        store.enqueue_many("q", [spec("b", {"x": 2})])
    assert db.client.transactions == ["start", "abort", "end_session"]


def test_a_racing_upsert_of_a_new_id_is_tried_once_more(db, store):
    # Given a concurrent producer that inserted the same new id between our read and write
    db[Q].answer("find_one_and_update", DuplicateKeyError("E11000"), None)
    assert store.enqueue_many("q", [spec("a", {"x": 1})], on_conflict="keep")[0].outcome is (
        EnqueueOutcome.CREATED)
    db[Q].answer("find_one_and_update", DuplicateKeyError("E11000"), DuplicateKeyError("E11000"))
    with pytest.raises(DuplicateKeyError):
        store.enqueue_many("q", [spec("b", {"x": 1})], on_conflict="keep")


def test_a_purge_round_that_deletes_nothing_stops(db, store):
    # Given ids found but already gone (another purger) when the delete runs
    db[Q].answer("find", [{"_id": "a"}], [{"_id": "a"}])
    db[Q].answer("delete_many", Deleted(0))
    assert store.purge("q", {"done": 60}) == 0
    assert db.sequence(Q).count("delete_many") == 1


def test_nested_payloads_compare_as_bson_does():
    assert upserts.bson_equal_payload({"a": [1, {"b": 2}]}, {"a": [1.0, {"b": 2}]})
    assert not upserts.bson_equal_payload({"a": [1, 2]}, {"a": [1]})
    assert not upserts.bson_equal_payload({"a": "1"}, {"a": 1})


@pytest.mark.parametrize("url", ["mongodb://h/db?prefix=a%20b", "mongodb://h/a.b",
                                 "mongodb://[::1/db"])
def test_bad_urls_are_refused_with_the_reason(url):
    with pytest.raises(InvalidURL):
        connection.parse_url(url)


def test_a_client_pymongo_refuses_is_an_invalid_url_with_the_password_masked():
    refused = ConfigurationError("bad option for u:pw9@h")
    with mock.patch.object(connection, "MongoClient", side_effect=refused), \
            pytest.raises(InvalidURL) as raised:
        connection.open_client("mongodb://u:pw9@h/db")
    assert "pw9" not in str(raised.value)


@pytest.mark.parametrize("port", ["99999", "abc"])
def test_a_bad_port_is_an_invalid_url_with_the_password_masked(port):
    # Given a URL whose port pymongo refuses with a bare ValueError
    url = f"mongodb://u:pw9@h:{port}/db"
    # When it is opened, Then it is InvalidURL, naming the URL with its password masked
    with pytest.raises(InvalidURL, match=r"mongodb://u:\*\*\*@h") as raised:
        connection.open_client(url)
    assert "pw9" not in str(raised.value) and "Port" in str(raised.value)


@pytest.mark.parametrize(("option", "said"), [
    ("readPreference=nearestx", "read preference"), ("timeoutMS=-5", "timeoutms"),
    ("connectTimeoutMS=abc", "connecttimeoutms"), ("wtimeoutms=1&retryWritez=true", "Unknown")])
def test_an_option_pymongo_cannot_read_is_an_invalid_url_not_a_warning(option, said):
    # Given a URL with an option the client would warn of and then go without
    url = f"mongodb://u:pw9@h/db?{option}"
    # When it is opened, Then it is InvalidURL saying why, the password masked
    with pytest.raises(InvalidURL, match=said) as raised:
        connection.open_client(url)
    assert "pw9" not in str(raised.value)


def test_other_operation_failures_pass_through_the_guard(db, store):
    db[Q].answer("find_one", OperationFailure("bad value", code=2))
    with pytest.raises(OperationFailure):
        store.get("q", "a")


def test_a_user_not_authorized_is_store_refused_by_the_guard(db, store):
    db[Q].answer("find_one", OperationFailure("not authorized on leaseq", code=13))
    with pytest.raises(StoreRefused, match="not authorized"):
        store.get("q", "a")


def test_secrets_of_a_url_without_a_password_or_unparseable():
    assert connection.secrets_of("mongodb://user@h/db") == ()
    assert connection.secrets_of("mongodb://[::1/db") == ()


def test_a_job_too_large_for_a_document_is_refused_and_its_transaction_aborted():
    # Given a replica set, and a batch whose second job the driver finds too large
    db = FakeDB(dict(REPLICA_SET))
    db[Q].answer("find_one_and_update", None, DocumentTooLarge("BSON document too large"))
    store = MongoStore(db)
    # Then it is a typed refusal, and the batch's transaction is aborted: nothing written
    with pytest.raises(InvalidPayload, match="nothing was written"):
        store.enqueue_many("q", [spec("a", {"x": 1}), spec("b", {"x": "big"})])
    assert db.client.transactions == ["start", "abort", "end_session"]


def test_a_result_that_would_outgrow_the_document_is_refused(db, store):
    # When the server refuses a completion: the job's document with its result is over 16 MiB
    db[Q].answer("find_one_and_update",
                 OperationFailure("BSONObj size: 17000000 is invalid", code=10334))
    # Then it is a typed refusal the runner turns into the job's permanent failure
    with pytest.raises(InvalidPayload, match="result_key"):
        store.complete("q", Lease("j1", 3), json.dumps("x" * 100))


def test_a_queue_may_not_allow_payloads_larger_than_a_document(store):
    assert store.queue("q", max_payload_bytes=16 * 1024 * 1024).policy.max_payload_bytes == (
        16 * 1024 * 1024)
    with pytest.raises(InvalidPolicy, match="more than MongoStore can hold"):
        store.queue("q", max_payload_bytes=32 * 1024 * 1024)
