"""MongoDB URLs: leaseq's own options, pymongo's defaults, and errors that never show a
password. Store-specific: ``connect`` hands the whole URL to this store."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pymongo import MongoClient, _csot
from pymongo.errors import (
    BulkWriteError,
    DocumentTooLarge,
    ExecutionTimeout,
    NetworkTimeout,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
    WTimeoutError,
)

from leaseq import deadline, validate
from leaseq.errors import InvalidPayload, InvalidURL, StoreRefused, StoreUnavailable
from leaseq.stores import connect
from leaseq.stores.mongodb.connection import (
    TIMEOUT_DEFAULTS_MS,
    guarded,
    mask,
    open_client,
    parse_ttl,
    parse_url,
    secrets_of,
)


def test_database_prefix_and_ttl_come_from_the_url_and_are_taken_out_of_it():
    parsed = parse_url("mongodb://h:27017/jobs?prefix=app_&ttl=tombstone:2592000&appName=x")
    assert (parsed.database, parsed.prefix) == ("jobs", "app_")
    assert parsed.ttl_s == {"tombstone": 2592000.0}
    assert parsed.mongo_url == "mongodb://h:27017/jobs?appName=x"


def test_options_other_than_leaseqs_reach_pymongo_as_written():
    # Given a URL whose values hold ':', ',' and an escaped ',' beside leaseq's own options
    rest = ("appName=a%2Cb&authMechanismProperties=SERVICE_NAME:other,CANONICALIZE_HOST_NAME:"
            "true&readPreferenceTags=dc:ny,rack:r1")
    # When leaseq takes its options out
    parsed = parse_url(f"mongodb://h/jobs?prefix=app_&{rest}&ttl=done:60&")
    # Then every other piece is passed on byte for byte
    assert parsed.mongo_url == f"mongodb://h/jobs?{rest}"
    assert (parsed.prefix, parsed.ttl_s) == ("app_", {"done": 60.0})


def test_read_preference_tags_reach_the_client_as_pymongo_reads_them():
    # Given a URL with two tag sets, the second empty (any member), and leaseq's options
    theirs = ("mongodb://127.0.0.1:1/app?connect=false&readPreference=nearest"
              "&readPreferenceTags=dc:ny,rack:r1&readPreferenceTags=")
    # When the store's client opens it
    _, client = open_client(theirs + "&prefix=app_&ttl=done:60")
    plain: MongoClient[Any] = MongoClient(theirs)
    # Then its tag sets are those pymongo reads from the URL alone
    try:
        assert client.read_preference.tag_sets == [{"dc": "ny", "rack": "r1"}, {}]
        assert client.read_preference.tag_sets == plain.read_preference.tag_sets
    finally:
        client.close()
        plain.close()


def test_defaults_are_leaseq_majority_retryable_writes_and_bounded_calls():
    parsed = parse_url("mongodb://h")
    assert (parsed.database, parsed.prefix, parsed.ttl_s) == ("leaseq", "leaseq_", None)
    assert parse_url("mongodb://h/?ttl=").ttl_s == {}  # given, and empty: no status expires
    assert parsed.client_options == {"tz_aware": True, "w": "majority", "retryWrites": True,
                                     **TIMEOUT_DEFAULTS_MS}
    assert TIMEOUT_DEFAULTS_MS == {"serverSelectionTimeoutMS": 10_000,
                                   "socketTimeoutMS": 30_000, "timeoutMS": 30_000}


def test_timeouts_in_the_url_win_and_reach_the_client():
    parsed = parse_url("mongodb://h/db?sockettimeoutms=5000&timeoutMS=8000")
    assert "socketTimeoutMS" not in parsed.client_options
    assert "timeoutMS" not in parsed.client_options
    assert parsed.client_options["serverSelectionTimeoutMS"] == 10_000
    _, client = open_client("mongodb://127.0.0.1:1/db?sockettimeoutms=5000&connect=false")
    try:
        assert client.options.pool_options.socket_timeout == 5.0
        assert (client.options.timeout, client.options.server_selection_timeout) == (30.0, 10.0)
    finally:
        client.close()


def test_a_write_concern_in_the_url_wins():
    parsed = parse_url("mongodb://h/db?w=1&retryWrites=false")
    assert "w" not in parsed.client_options and "retryWrites" not in parsed.client_options


@pytest.mark.parametrize("ttl", ["pending:60", "tombstone", "tombstone:0", "done:x"])
def test_a_ttl_on_a_live_status_or_without_seconds_is_refused(ttl):
    with pytest.raises(InvalidURL):
        parse_ttl(ttl)


def test_several_ttl_rules():
    assert parse_ttl("tombstone:60, done:86400") == {"tombstone": 60.0, "done": 86400.0}


def test_a_bad_prefix_is_refused():
    with pytest.raises(InvalidURL):
        parse_url("mongodb://h/db?prefix=a/b")


def test_secrets_are_the_password_as_written_and_decoded():
    assert set(secrets_of("mongodb://u:p%40ss@h/db")) == {"p%40ss", "p@ss"}
    assert secrets_of("mongodb://h/db") == ()


def test_an_aws_session_token_is_a_secret_too():
    # Given a URL for MONGODB-AWS with a session token, written as MongoDB documents it
    token = "FwoGZXIvYXdzEJr8SESSIONxyz"
    url = ("mongodb://AKIDEXAMPLE:wJalrSECRET@h/db?authMechanism=MONGODB-AWS"
           f"&authMechanismProperties=AWS_SESSION_TOKEN:{token}")
    # Then the token is masked wherever the store shows its URL or an error, as the password is
    assert token not in validate.redact_url(url) and "wJalrSECRET" not in validate.redact_url(url)
    assert "authMechanism=MONGODB-AWS" in validate.redact_url(url)
    assert any(token in secret for secret in secrets_of(url))
    assert token not in mask(f"auth failed for AWS_SESSION_TOKEN:{token}", secrets_of(url))


def test_unknown_store_options_are_refused():
    with pytest.raises(InvalidURL, match="unknown"):
        connect("mongodb://127.0.0.1:1/db", lease_s=3)


def test_an_unreachable_server_is_store_unavailable_soon_and_without_the_password():
    # Given a URL with a password and nothing listening, that waits 200 ms for a server
    url = "mongodb://user:hunter2@127.0.0.1:1/db?serverSelectionTimeoutMS=200"
    started = time.monotonic()
    # When the store opens
    with pytest.raises(StoreUnavailable) as raised:
        connect(url)
    # Then it gives up after the URL's wait, not after leaseq's 30 s timeoutMS (under which
    # pymongo ignores serverSelectionTimeoutMS)
    assert time.monotonic() - started < 10
    # ... and the error names the server but never the password
    assert "hunter2" not in str(raised.value)
    assert "user:***@127.0.0.1:1" in str(raised.value)


class _BulkTimedOut(PyMongoError):
    """A driver error outside the connection and operation families that says it timed out
    (a bulk write whose batches ran out of ``timeoutMS``)."""

    @property
    def timeout(self) -> bool:
        return True


class _Store:
    """Just what ``guarded`` reads of a store: its shown URL and its secrets."""

    url = "mongodb://u:***@h/db"
    secrets = ("hunter2",)

    def __init__(self, error: BaseException | None = None):
        self.error = error
        self.seen_timeout: float | None = None

    @guarded
    def call(self) -> str:
        self.seen_timeout = _csot.get_timeout()
        if self.error is not None:
            raise self.error
        return "ok"


def test_a_callers_deadline_becomes_pymongos_timeout():
    store = _Store()
    assert store.call() == "ok" and store.seen_timeout is None
    with deadline.within(0.5):
        store.call()
    assert store.seen_timeout is not None and 0 < store.seen_timeout <= 0.5


@pytest.mark.parametrize("error", [
    NetworkTimeout("timed out hunter2"),
    ExecutionTimeout("operation exceeded time limit", code=50),
    WTimeoutError("waiting for replication timed out", code=64),
    ServerSelectionTimeoutError("no servers"),
    _BulkTimedOut("bulk write timed out"),
], ids=["network", "server-time-limit", "write-concern", "server-selection", "bulk"])
def test_a_timed_out_call_is_store_unavailable_without_the_password(error):
    with pytest.raises(StoreUnavailable, match="unavailable") as raised:
        _Store(error).call()
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize("error", [
    OperationFailure("not authorized on jobs to execute command { find: ... } hunter2", code=13),
    OperationFailure("Authentication failed.", code=18),
], ids=["unauthorized", "authentication"])
def test_a_user_the_server_refuses_is_store_refused_without_the_password(error):
    with pytest.raises(StoreRefused, match="refused leaseq's call") as raised:
        _Store(error).call()
    assert isinstance(raised.value, StoreUnavailable) and "hunter2" not in str(raised.value)


@pytest.mark.parametrize("error", [OperationFailure("bad query", code=2),
                                   PyMongoError("not a timeout")])
def test_other_driver_errors_pass_through(error):
    with pytest.raises(type(error)):
        _Store(error).call()


@pytest.mark.parametrize("error", [
    DocumentTooLarge("BSON document too large (17000000 bytes)"),
    OperationFailure("BSONObj size: 17000000 is invalid", code=10334),
    OperationFailure("Resulting document after update is larger than 16777216", code=17419),
    BulkWriteError({"writeErrors": [{"index": 0, "code": 2, "errmsg": "other"},
                                    {"index": 1, "code": 17420, "errmsg": "too large"}]}),
], ids=["driver", "server", "server-older", "bulk"])
def test_a_document_over_mongodbs_limit_is_invalid_payload(error):
    with pytest.raises(InvalidPayload, match="over MongoDB's limit of 16777216 bytes"):
        _Store(error).call()


def test_a_bulk_write_refused_for_another_reason_passes_through():
    error = BulkWriteError({"writeErrors": [{"index": 0, "code": 11000, "errmsg": "dup"}]})
    with pytest.raises(BulkWriteError):
        _Store(error).call()
