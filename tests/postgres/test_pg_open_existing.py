"""PostgreSQL-specific: ``connect(url, create=False)`` and the commands that read make no
schema and no table, and say so in one line with the password masked. Store-specific: what
"nothing was made" means is read from the server's catalogue (the conformance suite checks
``schema_version``), and an older schema is made by rewriting its migrations table."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit, urlunsplit

import psycopg
import pytest
from click.testing import CliRunner

import leaseq
from leaseq.cli import cli
from leaseq.errors import StoreNotFound, StoreNotMigrated
from leaseq.stores.sql import latest_migration

LATEST = latest_migration("leaseq.stores.postgres")


def schema_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["schema"][0]


def with_a_password(url: str) -> tuple[str, str]:
    """The URL with a password in it (trust auth ignores it), and that password."""
    parts = urlsplit(url)
    if parts.password is not None or parts.username is None:
        return url, parts.password or "no password to leak"
    netloc = f"{parts.username}:s3cret@{parts.netloc.partition('@')[2]}"
    return urlunsplit(parts._replace(netloc=netloc)), "s3cret"


def catalogue(pg_url: str) -> Callable[..., int]:
    """``count(sql, *params)``: one number read from the server, outside any leaseq store."""
    def count(sql: str, *params: str) -> int:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            row = conn.execute(sql, params).fetchone()
            return int(row[0]) if row else 0
    return count


SCHEMAS = "SELECT count(*) FROM pg_namespace WHERE nspname = %s"
TABLES = "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s"


def test_a_missing_schema_is_not_found_and_not_made(schema_url: str, pg_url: str) -> None:
    # Given a URL whose schema= names no schema (a typo)
    url, password = with_a_password(schema_url)
    # When it is opened with create=False
    with pytest.raises(StoreNotFound) as refused:
        leaseq.connect(url, create=False)
    # Then the error names the store with its password masked, and no schema was made
    message = str(refused.value)
    assert schema_of(url) in message and "leaseq migrate" in message
    assert password not in message and "\n" not in message
    assert catalogue(pg_url)(SCHEMAS, schema_of(url)) == 0


def test_a_schema_without_leaseqs_tables_gets_none(schema_url: str, pg_url: str) -> None:
    # Given the schema exists, empty (another app's, or made by hand)
    schema = schema_of(schema_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    # When it is opened with create=False, Then it is not found and still holds no table
    with pytest.raises(StoreNotFound):
        leaseq.connect(schema_url, create=False)
    assert catalogue(pg_url)(TABLES, schema) == 0


def test_an_older_schema_is_refused_and_not_migrated(schema_url: str, pg_url: str) -> None:
    # Given a schema whose last migration is not recorded (an older leaseq made it)
    schema = schema_of(schema_url)
    leaseq.connect(schema_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'DELETE FROM "{schema}".schema_migrations WHERE version = %s', [LATEST])
    # When it is opened with create=False, Then it says to migrate, and nothing was migrated
    with pytest.raises(StoreNotMigrated, match="leaseq migrate"):
        leaseq.connect(schema_url, create=False)
    migrated = f'SELECT max(version) FROM "{schema}".schema_migrations'
    assert catalogue(pg_url)(migrated) == LATEST - 1


@pytest.mark.parametrize("command", ["status", "doctor"])
def test_status_and_doctor_on_a_missing_schema_exit_1_and_make_none(
    command: str, schema_url: str, pg_url: str
) -> None:
    url, password = with_a_password(schema_url)
    result = CliRunner().invoke(cli, [command, "--url", url])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("leaseq: no leaseq store at ")
    assert result.output.count("\n") == 1 and password not in result.output
    assert catalogue(pg_url)(SCHEMAS, schema_of(url)) == 0


def test_status_on_an_existing_schema_reads_it(schema_url: str) -> None:
    with leaseq.connect(schema_url) as store:
        store.queue("mail").enqueue("j1", {})
    result = CliRunner().invoke(cli, ["status", "--json", "--url", schema_url])
    assert result.exit_code == 0, result.output
    assert '"mail"' in result.output
