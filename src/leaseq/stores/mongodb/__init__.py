"""The MongoDB store: one collection per queue, the original design field for field
(``mongodb://host/database?prefix=leaseq_&ttl=tombstone:2592000``). See docs/mongodb.md."""

from leaseq.stores.mongodb.store import MongoStore

__all__ = ["MongoStore"]
