"""SQLite-only: ``connect(url, create=False)`` makes no file and writes to none. Store-specific:
what "nothing was created" means is a file on disk (the conformance suite checks the schema),
and an older schema needs SQL written as the older version wrote it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import leaseq
from leaseq.errors import StoreNotFound, StoreNotMigrated
from leaseq.stores.sql import migrations
from leaseq.stores.sqlite import schema

SQLITE = "leaseq.stores.sqlite"


def given_version(path: Path, upto: int) -> None:
    """A database at schema version ``upto``, made as that version made it."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE leaseq_schema "
                 "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL)")
    for version, name, sql in migrations(SQLITE):
        if version <= upto:
            conn.executescript(sql)
            conn.execute("INSERT INTO leaseq_schema VALUES (?, ?, 0)", (version, name))
    conn.close()


def test_a_missing_file_is_not_found_and_not_made(tmp_path: Path) -> None:
    # Given a URL naming a file that does not exist
    path = tmp_path / "typo.db"
    # When it is opened with create=False
    with pytest.raises(StoreNotFound) as refused:
        leaseq.connect(f"sqlite:///{path}", create=False)
    # Then the error names it and says how to create it, and no file was made
    assert f"sqlite:///{path}" in str(refused.value)
    assert "leaseq migrate" in str(refused.value)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_relative_path_is_not_made(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreNotFound) as refused:
        leaseq.connect("sqlite:///jobs.db", create=False)
    assert "sqlite:///jobs.db" in str(refused.value)
    assert list(tmp_path.iterdir()) == []


def test_a_new_memory_database_holds_no_store() -> None:
    with pytest.raises(StoreNotFound):
        leaseq.connect("sqlite:///:memory:", create=False)


def test_a_file_without_the_schema_is_left_byte_for_byte(tmp_path: Path) -> None:
    # Given another program's SQLite file (not in WAL mode)
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    # When it is opened with create=False, Then it is not found
    with pytest.raises(StoreNotFound):
        leaseq.connect(f"sqlite:///{path}", create=False)
    # And the file is as it was: no table, no WAL mode, no -wal or -shm file beside it
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["other.db"]


def test_an_older_schema_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    # Given a database one migration behind this code
    path = tmp_path / "jobs.db"
    given_version(path, schema.LATEST - 1)
    before = path.read_bytes()
    # When it is opened with create=False, Then it says to migrate, and nothing was migrated
    with pytest.raises(StoreNotMigrated, match="leaseq migrate") as refused:
        leaseq.connect(f"sqlite:///{path}", create=False)
    assert (refused.value.found, refused.value.expected) == (schema.LATEST - 1, schema.LATEST)
    assert path.read_bytes() == before


def test_a_newer_schema_opens(tmp_path: Path) -> None:
    # Given a database a newer leaseq migrated (one version past this code's)
    path = tmp_path / "jobs.db"
    leaseq.connect(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO leaseq_schema VALUES (?, 'future', 0)", (schema.LATEST + 1,))
    # When it is opened with create=False, Then it opens, as it does without
    with leaseq.connect(f"sqlite:///{path}", create=False) as store:
        assert store.schema_version() == schema.LATEST + 1
        assert store.queues() == []
