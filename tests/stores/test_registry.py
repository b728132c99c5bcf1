"""How ``leaseq.connect`` finds a store by its URL's scheme: the built-in table, the
``leaseq.stores`` entry points, and the typed errors when neither gives a usable store."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

import leaseq
import leaseq.stores as stores
import leaseq.testing.suites
from leaseq.errors import InvalidURL
from leaseq.stores.sqlite import SQLiteStore
from leaseq.testing.conformance import ALL_SUITES

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _entry_points(*points: EntryPoint) -> object:
    return lambda group: [p for p in points if p.group == group]


def test_pyproject_registers_exactly_the_built_in_table() -> None:
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"]["leaseq.stores"]
    assert declared == {scheme: e.target for scheme, e in stores.BUILTIN_STORES.items()}


def test_unknown_scheme_is_refused_with_the_known_ones_and_no_password() -> None:
    with pytest.raises(InvalidURL) as refused:
        leaseq.connect("redis://user:s3cret@host/0")
    message = str(refused.value)
    assert "'redis'" in message and "s3cret" not in message
    for scheme in stores.BUILTIN_STORES:
        assert f"{scheme}://" in message


def test_a_missing_driver_names_the_extra_that_installs_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given no psycopg importable, and the PostgreSQL store not yet imported
    monkeypatch.setitem(sys.modules, "psycopg", None)
    for name in [n for n in sys.modules if n.startswith("leaseq.stores.postgres")]:
        monkeypatch.delitem(sys.modules, name)
    # When a postgresql:// URL is opened, Then the error says how to install what is missing
    with pytest.raises(InvalidURL, match=r"pip install 'leaseq\[postgres\]'"):
        leaseq.connect("postgresql://user:s3cret@127.0.0.1/test")


def test_without_installed_metadata_the_built_in_stores_still_open(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Given a source tree run: no leaseq.stores entry points at all
    monkeypatch.setattr(stores, "entry_points", _entry_points())
    # Then every built-in scheme is still known, and SQLite opens
    assert set(stores.registered_stores()) == set(stores.BUILTIN_STORES)
    store = leaseq.connect(f"sqlite:///{tmp_path / 'jobs.db'}")
    try:
        assert isinstance(store, SQLiteStore)
    finally:
        store.close()


def test_a_package_adds_a_scheme_but_cannot_take_a_built_in_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stores, "entry_points", _entry_points(
        EntryPoint("sqlite", "builtins:object", "leaseq.stores"),
        EntryPoint("Lite", "leaseq.stores.sqlite:SQLiteStore", "leaseq.stores"),
    ))
    assert stores.store_class("sqlite") is SQLiteStore
    assert stores.store_class("lite") is SQLiteStore  # schemes are case-insensitive


@pytest.mark.parametrize("target, says", [
    ("builtins:object", "is not a leaseq Store subclass"),
    ("leaseq.stores.sqlite:NoSuchStore", "which does not exist"),
    ("leaseq_no_such_package.store:Store", "needs a library that is not installed"),
])
def test_a_broken_registration_is_a_typed_error(
        monkeypatch: pytest.MonkeyPatch, target: str, says: str) -> None:
    monkeypatch.setattr(stores, "entry_points", _entry_points(
        EntryPoint("broken", target, "leaseq.stores")))
    with pytest.raises(InvalidURL, match=says):
        leaseq.connect("broken://somewhere")


def test_every_built_in_store_opens_from_a_url_as_the_base_declares() -> None:
    declared = inspect.signature(stores.Store.from_url).parameters.keys()
    for scheme in stores.BUILTIN_STORES:
        store_class = stores.store_class(scheme)
        assert inspect.signature(store_class.from_url).parameters.keys() == declared, scheme


@pytest.mark.parametrize("declares, passed", [(True, {"create": False}), (False, {})])
def test_create_false_reaches_only_a_store_that_declares_it(
        monkeypatch: pytest.MonkeyPatch, declares: bool, passed: dict[str, object]) -> None:
    # Given a store class that records the options connect passes it
    seen: list[dict[str, object]] = []

    class Recording(SQLiteStore):
        supports_create_false = declares

        @classmethod
        def from_url(cls, url: str, **options: object) -> Recording:  # type: ignore[override]
            seen.append(options)
            return cls.__new__(cls)

    monkeypatch.setattr(stores, "store_class", lambda scheme, url=None: Recording)
    # When it is opened with create=False, Then only one that declares it is told so (one
    # written before create= existed opens as it always did, not with an unknown option)
    leaseq.connect("recording://somewhere", create=False)
    assert seen == [passed]


def test_every_suite_in_the_library_is_in_all_suites() -> None:
    # A new suite module is run by every store only once it is listed in ALL_SUITES.
    found = set()
    for info in pkgutil.iter_modules(leaseq.testing.suites.__path__):
        module = importlib.import_module(f"leaseq.testing.suites.{info.name}")
        found |= {obj for name, obj in vars(module).items()
                  if name.endswith("Suite") and inspect.isclass(obj)
                  and obj.__module__ == module.__name__}
    assert found == set(ALL_SUITES)
