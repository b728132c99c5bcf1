"""SQLite-only: what a sqlite:/// URL names. Store-specific: the other stores' URLs name a
server; this one names a file, whose name may hold characters a URL gives a meaning to."""

from __future__ import annotations

from pathlib import Path

import pytest

import leaseq
from leaseq.errors import InvalidURL


@pytest.mark.parametrize("name", ["a#b.db", "c?d.db", "e f.db", "100%.db"])
def test_a_file_name_written_percent_encoded_names_that_file(tmp_path: Path,
                                                            name: str) -> None:
    # Given a file name with a character a URL gives a meaning to, percent-encoded
    encoded = name.replace("%", "%25").replace("#", "%23").replace("?", "%3F").replace(
        " ", "%20")
    # When a store is opened at it
    with leaseq.connect(f"sqlite:///{tmp_path}/{encoded}") as store:
        store.queue("q").enqueue("j", {})
    # Then that file, and no other, was made
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))
                  ) == [name]


@pytest.mark.parametrize("tail", ["a#b.db", "c?d.db", "jobs.db#", "jobs.db?busy_timeout_ms"])
def test_a_url_that_would_name_another_file_is_refused(tmp_path: Path, tail: str) -> None:
    # Given a URL whose # or ? would cut the file name short (it opened "a" and "c")
    # When it is opened, Then it is refused, saying how to write such a name
    with pytest.raises(InvalidURL, match=r"%23|%3F"):
        leaseq.connect(f"sqlite:///{tmp_path}/{tail}")
    # And nothing was made
    assert list(tmp_path.iterdir()) == []


def test_the_store_url_opens_the_same_file_again(tmp_path: Path) -> None:
    # Given a store on a file whose name needs encoding
    with leaseq.connect(f"sqlite:///{tmp_path}/a%23b.db") as store:
        store.queue("q").enqueue("j", {})
        url = store.url
    # When its own URL is opened again (as a worker handed it would)
    with leaseq.connect(url, create=False) as again:
        # Then it is the same store
        assert again.get("q", "j") is not None


@pytest.mark.parametrize("value", ["-1", "2592000000", "99999999999999999999"])
def test_a_busy_timeout_sqlite_cannot_take_is_refused(tmp_path: Path, value: str) -> None:
    # Given a busy timeout below 0 or past SQLite's C int (30 days, say): SQLite took it as
    # 0, and every write met by another process's failed at once instead of waiting
    # When a store is opened with it, Then it is refused, and nothing was made
    with pytest.raises(InvalidURL, match="busy_timeout_ms"):
        leaseq.connect(f"sqlite:///{tmp_path}/jobs.db?busy_timeout_ms={value}")
    with pytest.raises(leaseq.InvalidInput, match="busy_timeout_ms"):
        leaseq.connect(f"sqlite:///{tmp_path}/jobs.db", busy_timeout_ms=int(value))
    assert list(tmp_path.iterdir()) == []
