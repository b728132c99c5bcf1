"""The doctor's ``schema`` check on a database migrated past, or short of, this leaseq: the
finding's four parts, and that reading the version wrote nothing (doctor never migrates).
SQLite: its migrations table is a file this test can write behind the store's back."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import leaseq
from leaseq.cli import cli
from leaseq.doctor import Finding, diagnose
from leaseq.stores.base import Store
from leaseq.stores.sql import migrations
from leaseq.stores.sqlite.store import SQLiteStore

LATEST = migrations("leaseq.stores.sqlite")[-1][0]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "jobs.db"


@pytest.fixture
def store(path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    store = leaseq.connect(f"sqlite:///{path}")

    def no_migrations(self: SQLiteStore) -> int:
        raise AssertionError("doctor ran migrate()")

    # Opened (and so migrated) first; from here on a migrate is a failure of the test
    monkeypatch.setattr(SQLiteStore, "migrate", no_migrations)
    yield store
    store.close()


def versions(path: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT version, name FROM leaseq_schema ORDER BY version").fetchall()


def write(path: Path, sql: str) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(sql)
    conn.close()


def schema_findings(store: Store) -> list[Finding]:
    return [f for f in diagnose(store).findings if f.check == "schema"]


def test_a_database_migrated_by_a_newer_leaseq_is_a_finding_and_is_left_alone(
    store: Store, path: Path
) -> None:
    # Given a database a newer leaseq migrated one step past this one
    write(path, f"INSERT INTO leaseq_schema VALUES ({LATEST + 1}, 'from_a_newer_leaseq', 0)")
    before = versions(path)
    # When doctor runs
    found = schema_findings(store)
    # Then it tells the four parts of the newer schema
    assert found == [Finding(
        "schema", None, f"the database schema is version {LATEST + 1}, this leaseq expects "
        f"{LATEST}", "the database was migrated by a newer leaseq than this host runs",
        "schema_version() against the migrations shipped with this leaseq",
        "upgrade leaseq on this host, then `leaseq migrate`")]
    assert found[0].severity == "fail"
    # And it wrote nothing: the version is unchanged and no migration ran (migrate() raises)
    assert versions(path) == before
    assert store.schema_version() == LATEST + 1


def test_leaseq_doctor_exits_non_zero_on_a_newer_schema(path: Path) -> None:
    # Opening the store (from_url) runs migrate, which finds nothing of this leaseq's to apply
    leaseq.connect(f"sqlite:///{path}").close()
    write(path, f"INSERT INTO leaseq_schema VALUES ({LATEST + 1}, 'from_a_newer_leaseq', 0)")
    before = versions(path)
    result = CliRunner().invoke(cli, ["doctor", "--url", f"sqlite:///{path}"])
    assert result.exit_code == 1
    assert f"the database schema is version {LATEST + 1}" in result.output
    assert versions(path) == before


def test_a_database_behind_this_leaseq_is_told_to_migrate(store: Store, path: Path) -> None:
    # Given a database whose last migration is not recorded (as if this leaseq were newer)
    write(path, f"DELETE FROM leaseq_schema WHERE version = {LATEST}")
    before = versions(path)
    # When doctor runs  Then the action is `leaseq migrate`, and doctor did not run it
    (found,) = schema_findings(store)
    assert found.symptom == (f"the database holds schema version {LATEST - 1}, this leaseq "
                             f"expects {LATEST}")
    assert found.action == "`leaseq migrate`, then `leaseq doctor`"
    assert versions(path) == before


def test_a_database_without_the_schema_is_told_to_migrate(store: Store, path: Path) -> None:
    write(path, "DROP TABLE leaseq_schema")
    (found,) = schema_findings(store)
    assert found.symptom == f"the database holds no leaseq schema, this leaseq expects {LATEST}"
    assert store.schema_version() is None
    with sqlite3.connect(path) as conn:  # and reading the version made no table
        assert conn.execute("SELECT count(*) FROM sqlite_master "
                            "WHERE name = 'leaseq_schema'").fetchone() == (0,)
