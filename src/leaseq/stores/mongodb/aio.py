"""The MongoDB store's asyncio reads on pymongo's native async client (``AsyncMongoClient``,
pymongo ≥ 4.10): ``aget``, ``acounts``, ``ajournal``, the same query documents as the
blocking reads. A client belongs to the event loop it first ran on, so there is one per
running loop, opened on first use; ``aclose()`` closes the running loop's. The writes
(``aenqueue_many``, ``arequeue``, ``acancel``) keep the blocking store's code, transactions
included, on the store's async worker thread (``Store._in_thread``): one implementation of
each write's guard, never two.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pymongo
from pymongo import ReadPreference
from pymongo.errors import PyMongoError

from leaseq import deadline
from leaseq.job import Job, JournalEntry
from leaseq.stores.mongodb import documents, records
from leaseq.stores.mongodb.connection import translated

if TYPE_CHECKING:
    from leaseq.stores.mongodb.store import MongoStore

#: ``() -> (database, close)``: an async database on a new client, and how to close it.
AsyncOpener = Callable[[], tuple[Any, Callable[[], Any]]]


class AsyncMongo:
    """The async reads of one ``MongoStore``."""

    def __init__(self, store: MongoStore, open_database: AsyncOpener):
        self._store = store
        self._open = open_database
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                                 tuple[Any, Callable[[], Any]]] = (
            weakref.WeakKeyDictionary())

    def _db(self) -> Any:
        loop = asyncio.get_running_loop()
        opened = self._by_loop.get(loop)
        if opened is None:
            opened = self._by_loop[loop] = self._open()
        return opened[0]

    def _primary(self, name: str) -> Any:
        """As the blocking store: its reads decide its writes, so from the primary."""
        return self._db()[name].with_options(read_preference=ReadPreference.PRIMARY)

    async def close(self) -> None:
        opened = self._by_loop.pop(asyncio.get_running_loop(), None)
        if opened is not None:
            await opened[1]()

    async def get(self, queue: str, job_id: str) -> Job | None:
        doc = await self._guard(self._primary(self._store._name(queue)).find_one(
            {"_id": job_id}))
        return None if doc is None else records.job(queue, doc)

    async def counts(self, queue: str) -> dict[str, int]:
        coll = self._primary(self._store._name(queue))
        cursor = await self._guard(coll.aggregate(documents.counts()))
        return {r["_id"]: r["n"] for r in await self._guard(cursor.to_list())}

    async def journal(self, queue: str, job_id: str) -> list[JournalEntry]:
        cursor = self._primary(self._store._prefix + "journal").find(
            documents.journal_of(queue, job_id), sort=documents.JOURNAL_SORT)
        return [records.entry(d) for d in await self._guard(cursor.to_list())]

    async def _guard(self, pending: Any) -> Any:
        """Await a driver call within the caller's ``leaseq.deadline`` (pymongo's own
        ``timeout``), its errors mapped to leaseq's as the blocking calls' are
        (``connection.translated``)."""
        remaining = deadline.remaining_s()
        try:
            if remaining is None:
                return await pending
            with pymongo.timeout(max(remaining, 0.001)):
                return await pending
        except PyMongoError as exc:
            mapped = translated(self._store, exc)
            if mapped is None:
                raise
            raise mapped from None
