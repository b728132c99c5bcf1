"""A fourth store added the way docs/stores.md says: a package that registers a store under a
new scheme through the ``leaseq.stores`` entry point, installed with pip, is found by
``leaseq.connect("wrapsqlite://…")`` and passes the whole conformance suite (every suite in
``ALL_SUITES``: about 130 tests, some 10 s on SQLite), in a pytest run of its own as a third
party would run it.

The package is written here as a wheel (a zip with its ``dist-info``) rather than built from a
pyproject.toml, so the test needs no build backend and no network: pip installs it offline
into the running environment, and it is uninstalled at the end.
"""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaseq.testing.conformance import NO_TRANSACTIONS

DISTRIBUTION = "leaseq-test-wrapstore"
SCHEME = "wrapsqlite"

STORE_MODULE = '''
"""leaseq's SQLite store under another scheme: wrapsqlite:///path/jobs.db."""

from typing import Any

from leaseq.errors import InvalidURL
from leaseq.stores.sqlite import SQLiteStore


class WrapSQLiteStore(SQLiteStore):
    @classmethod
    def from_url(cls, url: str, **options: Any) -> "WrapSQLiteStore":
        scheme, _, rest = url.partition("://")
        if scheme.lower() != "wrapsqlite":
            raise InvalidURL("a wrapsqlite URL starts with wrapsqlite://")
        return super().from_url("sqlite://" + rest, **options)
'''

CONFTEST = '''
import os
import shutil
import sqlite3
import tempfile
from contextlib import contextmanager

import pytest

pytest.register_assert_rewrite("leaseq.testing")

from leaseq import connect  # noqa: E402
from leaseq.testing import FreshStore, fresh_store  # noqa: E402


@contextmanager
def callers_transaction(path):
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    finally:
        conn.close()


class WrapFactory:
    def create(self):
        folder = tempfile.mkdtemp(prefix="wrapstore-")
        path = os.path.join(folder, "jobs.db")
        url = "wrapsqlite:///" + path
        store = connect(url)
        assert type(store).__name__ == "WrapSQLiteStore"
        return FreshStore(store, url, transaction=lambda: callers_transaction(path))

    def destroy(self, fresh):
        fresh.store.close()
        shutil.rmtree(os.path.dirname(fresh.url.removeprefix("wrapsqlite:///")))


@pytest.fixture
def leaseq_store():
    with fresh_store(WrapFactory()) as fresh:
        yield fresh
'''

TEST_CONFORMANCE = '''
from leaseq.testing.conformance import ALL_SUITES, bind_suites

globals().update(bind_suites(ALL_SUITES))
'''

# A store that says it has no transactions: the transaction suite skips, with the reason.
TEST_WITHOUT_TRANSACTIONS = '''
import pytest

from leaseq.testing.conformance import TransactionSuite


class TestNoTransactions(TransactionSuite):
    @pytest.fixture
    def leaseq_store(self, leaseq_store):
        leaseq_store.store.supports_transactions = False
        return leaseq_store
'''


def _wheel(folder: Path) -> Path:
    """The package as a wheel: the store module and its ``leaseq.stores`` entry point."""
    info = "leaseq_test_wrapstore-0.1.0.dist-info"
    files = {
        "wrapstore.py": STORE_MODULE,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: 0.1.0\n",
        f"{info}/WHEEL": ("Wheel-Version: 1.0\nGenerator: leaseq-tests\n"
                          "Root-Is-Purelib: true\nTag: py3-none-any\n"),
        f"{info}/entry_points.txt": f"[leaseq.stores]\n{SCHEME} = wrapstore:WrapSQLiteStore\n",
    }
    record = [f"{name},sha256={_digest(text)},{len(text.encode())}"
              for name, text in files.items()]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = folder / "leaseq_test_wrapstore-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


def _digest(text: str) -> str:
    raw = hashlib.sha256(text.encode()).digest()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"],
                   check=True, capture_output=True, timeout=120)


def _python(*args: str, cwd: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout_s)


@pytest.fixture
def installed_wrapstore(tmp_path: Path) -> Iterator[None]:
    pytest.importorskip("pip", reason="pip installs the test package")
    _pip("install", "--no-deps", "--no-index", str(_wheel(tmp_path)))
    try:
        yield
    finally:
        _pip("uninstall", "-y", DISTRIBUTION)


def test_connect_finds_a_store_registered_through_the_entry_point(
    installed_wrapstore: None, tmp_path: Path
) -> None:
    # Given the package installed, When a process connects with its scheme
    url = f"{SCHEME}:///{tmp_path / 'jobs.db'}"
    script = ("import leaseq; store = leaseq.connect(__import__('sys').argv[1]); "
              "print(type(store).__module__, type(store).__name__); "
              "store.queue('q').enqueue('j1', {}); print(store.queue('q').get('j1').status)")
    done = _python("-c", script, url, cwd=tmp_path, timeout_s=60)
    # Then it gets the package's store, and the store works
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["wrapstore WrapSQLiteStore", "pending"]


def test_the_registered_store_passes_the_conformance_suite(
    installed_wrapstore: None, tmp_path: Path
) -> None:
    # Given a third party's test folder: a factory for its store, the suites bound
    tests = tmp_path / "third_party_tests"
    tests.mkdir()
    for name, text in {"conftest.py": CONFTEST, "test_conformance.py": TEST_CONFORMANCE,
                       "test_without_transactions.py": TEST_WITHOUT_TRANSACTIONS}.items():
        (tests / name).write_text(textwrap.dedent(text))
    # When it runs the conformance suite on its own
    done = _python("-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tests),
                   cwd=tmp_path, timeout_s=600)
    # Then every test passes; the transaction suite skips, saying why, only where the store
    # says it has no transactions (and one test that reaches into leaseq's own stores' tables
    # skips on any other store)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-4000:]
    passed = re.search(r"(\d+) passed", report)
    assert passed and int(passed.group(1)) >= 100, report[-2000:]
    skips = re.findall(r"^SKIPPED \[1\] (\S+): (.*)$", report, re.MULTILINE)
    assert sorted(reason for _, reason in skips) == [
        "skipped: the suite cannot write older data into a WrapSQLiteStore",
        NO_TRANSACTIONS, NO_TRANSACTIONS, NO_TRANSACTIONS,
    ], skips
