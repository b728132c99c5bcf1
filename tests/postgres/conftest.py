"""PostgreSQL-only fixtures: the shared server's URL, a fresh schema per test, a throwaway
cluster for the restart test, and the ``--slow`` switch for the 1M-row EXPLAIN test.

Every test is skipped, with the reason, when the server cannot be reached.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

psycopg = pytest.importorskip("psycopg", reason="leaseq[postgres] is not installed")

from pg_urls import with_option  # noqa: E402

from leaseq.stores.postgres import PostgresStore  # noqa: E402
from leaseq.validate import redact_url  # noqa: E402

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


def pytest_addoption(parser: pytest.Parser) -> None:
    try:
        parser.addoption("--slow", action="store_true", default=False,
                         help="also run tests marked slow (or set LEASEQ_SLOW=1)")
    except ValueError:  # another conftest already added it
        pass


@pytest.fixture(autouse=True)
def _slow_only_when_asked(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("slow") is None:
        return
    asked = request.config.getoption("--slow", default=False) or os.environ.get("LEASEQ_SLOW")
    if not asked:
        pytest.skip("slow test: run with --slow or LEASEQ_SLOW=1")


@pytest.fixture(scope="session")
def pg_url() -> str:
    url = os.environ.get("LEASEQ_TEST_POSTGRES_URL") or DEFAULT_URL
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL not reachable at {redact_url(url)}: "
                    f"{str(exc).splitlines()[0] if str(exc) else exc!r}")
    return url


def unique_schema() -> str:
    return f"lq_pgtest_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def schema_url(pg_url: str) -> Iterator[str]:
    """A URL naming a schema no other test uses; the schema is dropped afterwards."""
    schema = unique_schema()
    yield with_option(pg_url, schema=schema)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def store(schema_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore.from_url(schema_url)
    try:
        yield store
    finally:
        store.close()


# --- a throwaway cluster ------------------------------------------------------------------


@dataclass
class Cluster:
    """A PostgreSQL cluster in a temporary folder, on its own port; the test may restart it."""

    folder: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def pg_ctl(self, *args: str) -> None:
        _run_as_owner(["pg_ctl", "-D", str(self.folder / "data"), "-w", "-t", "60",
                       "-l", str(self.folder / "log"), *args])

    def restart(self) -> None:
        self.pg_ctl("restart", "-m", "fast", "-o", self._server_options())

    def _server_options(self) -> str:
        return f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1"


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """Never the shared server: ``initdb`` + ``pg_ctl`` in a temp dir, on a free port."""
    for tool in ("initdb", "pg_ctl"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not on PATH: cannot start a throwaway PostgreSQL")
    folder = Path(tempfile.mkdtemp(prefix="leaseq-pg-"))
    if os.geteuid() == 0:  # initdb refuses root: the cluster belongs to the postgres user
        shutil.chown(folder, "postgres", "postgres")
    cluster = Cluster(folder, _free_port())
    try:
        _run_as_owner(["initdb", "-D", str(folder / "data"), "-U", "postgres",
                       "--auth=trust", "-E", "UTF8", "--no-sync"])
        cluster.pg_ctl("start", "-o", cluster._server_options())
        yield cluster
    finally:
        try:
            cluster.pg_ctl("stop", "-m", "immediate")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(folder, ignore_errors=True)


def _run_as_owner(command: list[str]) -> None:
    if os.geteuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    subprocess.run(command, check=True, capture_output=True, timeout=120)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

