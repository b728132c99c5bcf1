"""Stores and ``connect``: the URL's scheme picks the store.

A scheme names a ``Store`` subclass through the entry-point group ``leaseq.stores``
(``name = "package.module:StoreClass"``), so a package adds a store by installing itself; see
docs/stores.md. The built-in schemes are registered there too (pyproject.toml), and also read
from ``BUILTIN_STORES`` so leaseq works from a source tree with no installed metadata.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any
from urllib.parse import urlsplit

from leaseq.errors import InvalidURL
from leaseq.redact import ENCODE_HINT
from leaseq.stores.base import Store
from leaseq.validate import redact_url

DEFAULT_URL = "sqlite:///leaseq.db"

#: The entry-point group a package registers its store under: scheme = "module:StoreClass".
ENTRY_POINT_GROUP = "leaseq.stores"


@dataclass(frozen=True)
class StoreEntry:
    """Where a scheme's store class lives, and what installs what it needs."""

    target: str
    """``"module:attr"``, as an entry point's value."""
    origin: str
    """Who registered it: ``"leaseq"`` or the distribution's name."""
    extra: str | None = None
    """The leaseq extra that installs its driver (``pip install 'leaseq[extra]'``)."""


#: The built-in stores: the one home of this table (pyproject.toml's entry points mirror it,
#: and a test keeps the two equal). A package may add schemes, never take one of these over.
BUILTIN_STORES: dict[str, StoreEntry] = {
    "sqlite": StoreEntry("leaseq.stores.sqlite:SQLiteStore", "leaseq"),
    "postgresql": StoreEntry("leaseq.stores.postgres:PostgresStore", "leaseq", "postgres"),
    "postgres": StoreEntry("leaseq.stores.postgres:PostgresStore", "leaseq", "postgres"),
    "mongodb": StoreEntry("leaseq.stores.mongodb:MongoStore", "leaseq", "mongo"),
    "mongodb+srv": StoreEntry("leaseq.stores.mongodb:MongoStore", "leaseq", "mongo"),
    "django": StoreEntry("leaseq.contrib.django.store:DjangoStore", "leaseq", "django"),
}


def connect(url: str | None = None, *, create: bool = True, **options: Any) -> Store:
    """Open the store a URL names: ``sqlite:///path``, ``postgresql://…``, ``mongodb://…``,
    or any scheme an installed package registers under ``leaseq.stores``.

    ``url`` defaults to ``$LEASEQ_URL``, then ``sqlite:///leaseq.db``; an empty one is refused
    (it is a URL lost on its way, and would open another store). The schema is created
    (or upgraded) on first use. With ``create=False`` nothing is created, upgraded or indexed:
    a URL with no leaseq schema raises ``StoreNotFound`` (a mistyped URL is not made into an
    empty store), one older than this leaseq ``StoreNotMigrated``; what the inspecting commands
    use. A store that does not declare ``supports_create_false`` opens as with ``create``.
    Raises ``InvalidURL`` (password masked) or ``StoreUnavailable``.
    """
    if url is None:
        url = os.environ.get("LEASEQ_URL") or DEFAULT_URL
    if not isinstance(url, str):
        raise InvalidURL(f"a store URL must be a string, got {type(url).__name__}")
    if not url.strip():  # not $LEASEQ_URL's store, nor a new leaseq.db: a URL lost upstream
        raise InvalidURL("the store URL is empty: give one, or leave it out for $LEASEQ_URL "
                         f"(then {DEFAULT_URL})")
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError:  # its message may quote the netloc, password included: not shown
        raise InvalidURL(f"cannot parse store URL {redact_url(url)}; {ENCODE_HINT}") from None
    found = store_class(scheme, url)
    if not create and found.supports_create_false:
        options["create"] = False
    return found.from_url(url, **options)


def registered_stores() -> dict[str, StoreEntry]:
    """Every known scheme: the built-in ones, then those installed packages register."""
    found = dict(BUILTIN_STORES)
    for point in entry_points(group=ENTRY_POINT_GROUP):
        scheme = point.name.lower()
        if scheme not in found:  # a built-in scheme, or the first package to claim one, wins
            origin = point.dist.name if point.dist is not None else "an installed package"
            found[scheme] = StoreEntry(point.value, origin)
    return found


def store_class(scheme: str, url: str | None = None) -> type[Store]:
    """The ``Store`` subclass registered for ``scheme``. Raises ``InvalidURL`` for an unknown
    scheme (listing the known ones), or when its module cannot be imported."""
    shown = f" in {redact_url(url)}" if url is not None else ""
    stores = registered_stores()
    entry = stores.get(scheme.lower())
    if entry is None:
        known = ", ".join(sorted(f"{s}://" for s in stores))
        raise InvalidURL(f"unknown store URL scheme {scheme!r}{shown}; use one of {known}")
    found = _load(scheme, entry)
    if not (isinstance(found, type) and issubclass(found, Store)):
        raise InvalidURL(f"the {scheme}:// store registered by {entry.origin} "
                         f"({entry.target}) is not a leaseq Store subclass")
    return found


def _load(scheme: str, entry: StoreEntry) -> Any:
    try:
        return EntryPoint(scheme, entry.target, ENTRY_POINT_GROUP).load()
    except ImportError as exc:
        hint = f" Install it with: pip install 'leaseq[{entry.extra}]'" if entry.extra else ""
        raise InvalidURL(f"the {scheme} store needs a library that is not installed "
                         f"({exc.name}).{hint}") from None
    except AttributeError:
        raise InvalidURL(f"the {scheme}:// store registered by {entry.origin} names "
                         f"{entry.target}, which does not exist") from None


__all__ = [
    "BUILTIN_STORES",
    "DEFAULT_URL",
    "ENTRY_POINT_GROUP",
    "Store",
    "StoreEntry",
    "connect",
    "registered_stores",
    "store_class",
]
