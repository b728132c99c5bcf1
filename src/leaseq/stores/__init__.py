"""Stores and ``connect``: the URL's scheme picks the store."""

from __future__ import annotations

import importlib
import os
from typing import Any
from urllib.parse import urlsplit

from leaseq.errors import InvalidURL
from leaseq.stores.base import Store
from leaseq.validate import redact_url

DEFAULT_URL = "sqlite:///leaseq.db"

_SCHEMES = {
    "sqlite": ("leaseq.stores.sqlite", "SQLiteStore", None),
    "postgresql": ("leaseq.stores.postgres", "PostgresStore", "postgres"),
    "postgres": ("leaseq.stores.postgres", "PostgresStore", "postgres"),
    "mongodb": ("leaseq.stores.mongodb", "MongoStore", "mongo"),
    "mongodb+srv": ("leaseq.stores.mongodb", "MongoStore", "mongo"),
}


def connect(url: str | None = None, **options: Any) -> Store:
    """Open the store a URL names: ``sqlite:///path``, ``postgresql://…``, ``mongodb://…``.

    ``url`` defaults to ``$LEASEQ_URL``, then ``sqlite:///leaseq.db``. The schema is created on
    first use. Raises ``InvalidURL`` (password masked) or ``StoreUnavailable``.
    """
    url = url or os.environ.get("LEASEQ_URL") or DEFAULT_URL
    if not isinstance(url, str):
        raise InvalidURL(f"a store URL must be a string, got {type(url).__name__}")
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError as exc:
        raise InvalidURL(f"cannot parse store URL {redact_url(url)}: {exc}") from None
    if scheme not in _SCHEMES:
        known = ", ".join(sorted({f"{s}://" for s in _SCHEMES}))
        raise InvalidURL(
            f"unknown store URL scheme {scheme!r} in {redact_url(url)}; use one of {known}"
        )
    module_name, class_name, extra = _SCHEMES[scheme]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f" Install it with: pip install 'leaseq[{extra}]'" if extra else ""
        raise InvalidURL(
            f"the {scheme} store needs a library that is not installed ({exc.name}).{hint}"
        ) from None
    store_class = getattr(module, class_name)
    return store_class.from_url(url, **options)


__all__ = ["DEFAULT_URL", "Store", "connect"]
