"""A fresh database for every run: a new SQLite file, PostgreSQL schema or MongoDB database,
removed afterwards, so no run sees another's rows, indexes or statistics."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


@dataclass(frozen=True)
class Target:
    """Where one run writes. ``url`` is the leaseq URL; the rest serves the other adapters."""

    kind: str  # "sqlite", "postgresql" or "mongodb"
    url: str
    sqlite_path: str | None = None
    pg_conninfo: str | None = None  # the server and database, without leaseq's ?schema=
    pg_schema: str | None = None
    mongo_url: str | None = None
    mongo_db: str | None = None

    def pg_connect(self, **kwargs: object):  # -> psycopg.Connection
        """An autocommit psycopg connection whose search_path is this run's schema."""
        import psycopg

        return psycopg.connect(self.pg_conninfo, autocommit=True,
                               options=f"-c search_path={self.pg_schema}", **kwargs)


def kind_of(url: str) -> str:
    scheme = urlsplit(url).scheme.lower()
    if scheme == "sqlite":
        return "sqlite"
    if scheme in ("postgresql", "postgres"):
        return "postgresql"
    if scheme.startswith("mongodb"):
        return "mongodb"
    raise ValueError(f"unsupported store URL scheme {scheme!r}: use sqlite://, postgresql:// "
                     "or mongodb://")


def describe(url: str) -> str:
    """The URL without credentials, for tables and JSON."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


@contextlib.contextmanager
def fresh(base_url: str, label: str = "run") -> Iterator[Target]:
    """A new, empty database next to ``base_url``; dropped when the block ends.

    Every run starts with the kernel's dirty pages written out (``os.sync``): a run's files
    (a SQLite database, PostgreSQL's WAL) are written back by the kernel for seconds after
    it ends, and without this the next run, often another library's, shares the disk with
    that writeback."""
    name = f"bench_{label}_{uuid.uuid4().hex[:10]}"
    kind = kind_of(base_url)
    os.sync()
    if kind == "sqlite":
        with _fresh_sqlite(base_url, name) as target:
            yield target
    elif kind == "postgresql":
        with _fresh_postgres(base_url, name) as target:
            yield target
    else:
        with _fresh_mongo(base_url, name) as target:
            yield target


@contextlib.contextmanager
def _fresh_sqlite(base_url: str, name: str) -> Iterator[Target]:
    # sqlite:///bench.db → fresh files beside bench.db; sqlite:// alone → a temporary folder.
    given = urlsplit(base_url).path[1:]
    folder = os.path.dirname(os.path.abspath(given)) if given else tempfile.mkdtemp("-leaseq")
    path = os.path.join(folder, f"{name}.db")
    try:
        yield Target("sqlite", f"sqlite:///{path}", sqlite_path=path)
    finally:
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path + suffix)
        if not given:
            with contextlib.suppress(OSError):
                os.rmdir(folder)


@contextlib.contextmanager
def _fresh_postgres(base_url: str, name: str) -> Iterator[Target]:
    import psycopg

    parts = urlsplit(base_url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "schema"]
    conninfo = urlunsplit(("postgresql", parts.netloc, parts.path, "", ""))
    url = urlunsplit((parts.scheme, parts.netloc, parts.path,
                      urlencode([*query, ("schema", name)]), ""))
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
        _checkpoint(conn)
    try:
        yield Target("postgresql", url, pg_conninfo=conninfo, pg_schema=name)
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _checkpoint(conn: Any) -> None:
    """Start the run from a checkpoint. The server checkpoints every ~500 MB of WAL (default
    max_wal_size) and spreads the writes over most of the interval: without this, one
    library's WAL starts a checkpoint that the next run, often another library's, pays for in
    slower commits. Skipped, with a note, where the role may not checkpoint."""
    import psycopg

    try:
        conn.execute("CHECKPOINT")
    except psycopg.errors.InsufficientPrivilege:
        print("bench: this role may not CHECKPOINT; runs may share a checkpoint's writes")


@contextlib.contextmanager
def _fresh_mongo(base_url: str, name: str) -> Iterator[Target]:
    import pymongo

    parts = urlsplit(base_url)
    url = urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))
    try:
        yield Target("mongodb", url, mongo_url=base_url, mongo_db=name)
    finally:
        with pymongo.MongoClient(base_url) as client:
            client.drop_database(name)


def postgres_reachable(url: str) -> str | None:
    """None when a connection works, else why not (one line, no secrets)."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install 'leaseq[postgres]')"
    parts = urlsplit(url)
    try:
        with psycopg.connect(urlunsplit(("postgresql", parts.netloc, parts.path, "", "")),
                             connect_timeout=3):
            return None
    except psycopg.Error as exc:
        return f"cannot connect to {describe(url)}: {str(exc).strip().splitlines()[0]}"
