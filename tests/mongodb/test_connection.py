"""MongoDB URLs: leaseq's own options, pymongo's defaults, and errors that never show a
password. Store-specific: ``connect`` hands the whole URL to this store."""

from __future__ import annotations

import pytest

from leaseq.errors import InvalidURL, StoreUnavailable
from leaseq.stores import connect
from leaseq.stores.mongodb.connection import parse_ttl, parse_url, secrets_of


def test_database_prefix_and_ttl_come_from_the_url_and_are_taken_out_of_it():
    parsed = parse_url("mongodb://h:27017/jobs?prefix=app_&ttl=tombstone:2592000&appName=x")
    assert (parsed.database, parsed.prefix) == ("jobs", "app_")
    assert parsed.ttl_s == {"tombstone": 2592000.0}
    assert parsed.mongo_url == "mongodb://h:27017/jobs?appName=x"


def test_defaults_are_leaseq_majority_and_retryable_writes():
    parsed = parse_url("mongodb://h")
    assert (parsed.database, parsed.prefix, parsed.ttl_s) == ("leaseq", "leaseq_", {})
    assert parsed.client_options == {"tz_aware": True, "w": "majority", "retryWrites": True}


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


def test_unknown_store_options_are_refused():
    with pytest.raises(InvalidURL, match="unknown"):
        connect("mongodb://127.0.0.1:1/db", lease_s=3)


def test_an_unreachable_server_is_store_unavailable_without_the_password():
    # Given a URL with a password and nothing listening  When the store opens
    url = "mongodb://user:hunter2@127.0.0.1:1/db?serverSelectionTimeoutMS=200"
    with pytest.raises(StoreUnavailable) as raised:
        connect(url)
    # Then the error names the server but never the password
    assert "hunter2" not in str(raised.value)
    assert "user:***@127.0.0.1:1" in str(raised.value)
