"""The SQLite schema's migrations: ``migrations/NNN_name.sql``, each applied once, in order."""

from __future__ import annotations

import sqlite3

from leaseq.stores.sql import latest_migration, migrations

#: The schema version this code expects: its last migration's.
LATEST = latest_migration(__package__)


def migrate(conn: sqlite3.Connection) -> int:
    """Apply the migrations ``conn``'s database lacks; safe to race (``apply`` decides each
    under the write lock). Returns the version."""
    conn.execute("CREATE TABLE IF NOT EXISTS leaseq_schema "
                 "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL)")
    done = {r[0] for r in conn.execute("SELECT version FROM leaseq_schema")}
    latest = max(done, default=0)
    for version, name, sql in migrations(__package__):
        if version not in done:
            apply(conn, version, name, sql)
            latest = version
    return latest


def version(conn: sqlite3.Connection) -> int | None:
    """The highest migration applied to ``conn``'s database, read only; None when leaseq's
    schema was never made there (no table is created to find out)."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                    "AND name = 'leaseq_schema'").fetchone() is None:
        return None
    found = conn.execute("SELECT max(version) FROM leaseq_schema").fetchone()[0]
    return None if found is None else int(found)


def apply(conn: sqlite3.Connection, version: int, name: str, sql: str) -> None:
    """One migration in one transaction, decided under the write lock: its version is
    recorded first, after ``BEGIN IMMEDIATE``, so a version another process applied since the
    versions were read fails that insert (primary key) and the migration is skipped before
    any of it runs. Running it again was not safe: 009 rebuilds the jobs table from a fixed
    column list, and run after 010 it dropped ``next_concurrency_key``. A migration that fails
    otherwise is rolled back, its version with it, and raises."""
    try:
        conn.executescript(
            f"BEGIN IMMEDIATE;\nINSERT INTO leaseq_schema "
            f"VALUES ({version}, '{name}', julianday('now'));\n{sql}\nCOMMIT;"
        )
    except sqlite3.IntegrityError:
        if not conn.in_transaction:
            raise
        conn.execute("ROLLBACK")
        if not conn.execute("SELECT 1 FROM leaseq_schema WHERE version = ?",
                            (version,)).fetchone():
            raise
    except sqlite3.Error:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
