"""PostgreSQL-specific: who may open a store, and how long an upgrade may wait. Store-specific:
roles, privileges and table locks are PostgreSQL's own (SQLite has one writer and no roles;
MongoDB's index builds take no such lock).

- A role that may only read and write rows opens a schema its owner migrated: with nothing
  owed, opening runs no DDL (PostgreSQL checks the CREATE right before it looks whether the
  object exists, so ``CREATE SCHEMA IF NOT EXISTS`` alone refused it).
- Where a migration is owed and the role may not create, ``MigrationRefused`` says so and
  what to do, with the password masked, and nothing is made.
- An upgrade that meets a session holding the jobs table waits for its lock at most
  ``reconnect_s``, then raises ``StoreUnavailable`` having changed nothing: a queued ACCESS
  EXCLUSIVE request holds every other session's reads and writes behind it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from pg_urls import with_option

import leaseq
from leaseq.errors import MigrationRefused, StoreUnavailable
from leaseq.stores.sql import migrations

MIGRATIONS = migrations("leaseq.stores.postgres")
PASSWORD = "app-s3cret"


def as_role(url: str, role: str) -> str:
    """``url`` logging in as ``role`` with ``PASSWORD`` (trust auth ignores it)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{role}:{PASSWORD}@{host}"))




@pytest.fixture
def app_role(pg_url: str) -> Iterator[str]:
    """A login role of its own, with no right to create anything."""
    role = f"lq_app_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    yield role
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


@pytest.fixture
def schema(pg_url: str) -> Iterator[str]:
    name = f"lq_rights_{uuid.uuid4().hex[:10]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def grant_rows(pg_url: str, schema: str, role: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} "
                     f"TO {role}")
        conn.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role}")


def schema_at(pg_url: str, schema: str, version: int) -> None:
    """``schema`` as an older leaseq left it: its migrations up to ``version`` only."""
    with psycopg.connect(pg_url) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.schema_migrations (version integer PRIMARY KEY, "
                     "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        for number, name, text in MIGRATIONS:
            if number <= version:
                conn.execute(text.replace("{schema}", schema))
                conn.execute(f"INSERT INTO {schema}.schema_migrations (version, name) "
                             "VALUES (%s, %s)", (number, name))


def versions(pg_url: str, schema: str) -> list[int]:
    with psycopg.connect(pg_url) as conn:
        return [r[0] for r in conn.execute(
            f"SELECT version FROM {schema}.schema_migrations ORDER BY version")]


def test_a_role_that_only_writes_rows_opens_a_migrated_store(
        pg_url: str, schema: str, app_role: str) -> None:
    # Given a schema its owner migrated, and a role granted only its rows
    leaseq.connect(with_option(pg_url, schema=schema)).close()
    grant_rows(pg_url, schema, app_role)
    # When that role opens it as a worker does (create=True) and runs a job through
    with leaseq.connect(with_option(as_role(pg_url, app_role), schema=schema)) as store:
        queue = store.queue("rights")
        queue.enqueue("j1", {"n": 1})
        [job] = queue.claim("w1", limit=1)
        done = queue.complete(job, {"ok": True})
    # Then the job is done: opening asked for no right the role lacks
    assert done.status == "done"


def test_a_role_that_may_not_create_is_told_to_run_migrate(
        pg_url: str, schema: str, app_role: str) -> None:
    # Given a URL whose role may not create, naming a schema that is not there
    url = with_option(as_role(pg_url, app_role), schema=schema)
    # When it is opened as a worker would
    with pytest.raises(MigrationRefused) as refused:
        leaseq.connect(url)
    # Then the error says what to do, masks the password, and nothing was made
    message = str(refused.value)
    assert "leaseq migrate" in message and schema in message
    assert PASSWORD not in message and "\n" not in message
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s",
                           [schema]).fetchone()
    assert row == (0,)


def test_an_upgrade_behind_a_held_table_gives_up_in_bounded_time_and_changes_nothing(
        pg_url: str, schema: str) -> None:
    # Given a schema one migration behind, and a session holding its jobs table open
    owed = MIGRATIONS[-1][0]
    schema_at(pg_url, schema, owed - 1)
    holder = psycopg.connect(pg_url)
    holder.execute(f"SELECT count(*) FROM {schema}.jobs")
    outcome: dict[str, BaseException | str] = {}

    def open_store() -> None:
        try:
            leaseq.connect(with_option(pg_url, schema=schema, reconnect_s=1)).close()
            outcome["r"] = "opened"
        except BaseException as exc:  # reported to the test's thread
            outcome["r"] = exc

    try:
        # When a worker of this leaseq opens it, with reconnect_s=1
        opener = threading.Thread(target=open_store, daemon=True)
        opener.start()
        opener.join(30)
        # Then it gave up with StoreUnavailable instead of waiting for the holder
        assert not opener.is_alive(), "the upgrade waited for the holder's lock without bound"
        assert isinstance(outcome["r"], StoreUnavailable), outcome["r"]
        assert "lock" in str(outcome["r"])
        # and changed nothing: the owed migration is still owed
        assert owed not in versions(pg_url, schema)
    finally:
        holder.close()
    # And once the holder is gone, the same URL upgrades the schema
    leaseq.connect(with_option(pg_url, schema=schema, reconnect_s=1)).close()
    assert versions(pg_url, schema)[-1] == owed
