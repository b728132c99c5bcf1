"""SQLite-only: the WAL is checkpointed by a thread of the store's own, not by its commits."""

from __future__ import annotations

import logging
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

import leaseq
from leaseq.stores.sqlite.checkpoint import BACKSTOP_PAGES, Checkpointer


def _until(condition, timeout_s: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _file_alone(db: Path, tmp_path: Path) -> sqlite3.Connection:
    """The database file copied without its WAL: what a checkpoint has written into it."""
    copy = tmp_path / "copy.db"
    shutil.copyfile(db, copy)
    return sqlite3.connect(copy)


def _jobs_in_file_alone(tmp_path: Path) -> int:
    """How many jobs the store's database file holds without its WAL."""
    with _file_alone(tmp_path / "jobs.db", tmp_path) as copy:
        try:
            return int(copy.execute("SELECT count(*) FROM leaseq_jobs").fetchone()[0])
        except sqlite3.DatabaseError:  # the table not checkpointed yet, or a copy taken
            return 0                    # while a checkpoint was writing the file (torn)


def _wal_with_rows(db: Path) -> sqlite3.Connection:
    """A WAL database whose 500 rows are only in the WAL (no commit checkpoints)."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("CREATE TABLE t (n INTEGER, pad TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(n, "x" * 200) for n in range(500)])
    return conn


def test_the_thread_copies_the_wal_into_the_database_file(tmp_path: Path) -> None:
    # Given a database whose committed rows are only in its WAL
    db = tmp_path / "jobs.db"
    writer = _wal_with_rows(db)
    with _file_alone(db, tmp_path) as before:
        assert before.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)
    # When a checkpointer runs
    checkpoints = Checkpointer(str(db), every_s=0.01)
    try:
        _until(lambda: checkpoints.last is not None and checkpoints.last[1] > 0
               and checkpoints.last[1] == checkpoints.last[2])
    finally:
        checkpoints.stop()
    # Then the database file itself holds them, and the thread has ended
    with _file_alone(db, tmp_path) as after:
        assert after.execute("SELECT count(*) FROM t").fetchone() == (500,)
    assert not checkpoints.running
    writer.close()


def test_a_file_store_checkpoints_off_its_commits_and_stops_when_closed(
        tmp_path: Path) -> None:
    store = leaseq.connect(f"sqlite:///{tmp_path / 'jobs.db'}")
    checkpoints = store._checkpoints  # type: ignore[attr-defined]
    try:
        # A commit checkpoints only once the thread is BACKSTOP_PAGES behind
        assert checkpoints is not None and checkpoints.running
        assert store._conn.execute(  # type: ignore[attr-defined]
            "PRAGMA wal_autocheckpoint").fetchone() == (BACKSTOP_PAGES,)
        # And what the store commits reaches the database file without a commit copying it
        queue = store.queue("q")
        queue.enqueue_many([queue.spec(f"j{n}", {"n": n}) for n in range(200)])
        # (Waiting on the thread's last result alone raced: a checkpoint of the store's own
        # set-up, before this commit, already showed every page copied.)
        _until(lambda: _jobs_in_file_alone(tmp_path) == 200)
    finally:
        store.close()
    assert not checkpoints.running


def test_a_store_in_memory_has_no_checkpointer() -> None:
    store = leaseq.connect("sqlite:///:memory:")
    try:
        assert store._checkpoints is None  # type: ignore[attr-defined]
    finally:
        store.close()


def test_a_database_the_thread_cannot_open_leaves_the_checkpoints_to_the_commits(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="leaseq.stores.sqlite.checkpoint"):
        checkpoints = Checkpointer(str(tmp_path / "missing" / "jobs.db"), every_s=0.01)
    assert not checkpoints.running
    assert "stay on the commits" in caplog.text
    checkpoints.stop()


def test_the_thread_checkpoints_the_database_the_store_named_after_a_change_of_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a database named by a relative path
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    writer = _wal_with_rows(Path("jobs.db"))
    # When a checkpointer is made for it and the process then changes directory
    checkpoints = Checkpointer("jobs.db", every_s=0.01)
    monkeypatch.chdir(tmp_path / "b")
    try:
        _until(lambda: checkpoints.last is not None and checkpoints.last[1] > 0
               and checkpoints.last[1] == checkpoints.last[2])
    finally:
        checkpoints.stop()
    # Then it checkpointed the first one and made no database in the second directory
    assert not list((tmp_path / "b").iterdir())
    writer.close()
