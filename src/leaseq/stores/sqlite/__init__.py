"""The SQLite store: leaseq's embedded default (``sqlite:///path/to/jobs.db``)."""

from leaseq.stores.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore"]
