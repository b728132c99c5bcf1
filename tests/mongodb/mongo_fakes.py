"""A recording stand-in for pymongo's database and collections.

Store-specific on purpose: no MongoDB server can run where these tests run, and mongomock
does not evaluate ``$$NOW``, ``$dateAdd`` or pipeline updates faithfully. These fakes check the
store's control flow (which statement, with which builder's document, in which order, and what
it does with the answer); the documents themselves are asserted in test_documents.py, and the
semantics on a real server by the conformance suite (LEASEQ_TEST_MONGODB_URL).

The fake holds the store to pymongo's own rules where pymongo can say them without a server:
every call is bound to the real method's signature (a misspelt keyword fails here as it would
there), every filter, update and pipeline must encode as BSON and pass pymongo's update
validation, and the answers are pymongo's real result classes.
"""

from __future__ import annotations

import inspect
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import bson
from pymongo import ReadPreference, common
from pymongo.collection import Collection
from pymongo.cursor import Cursor
from pymongo.errors import InvalidOperation
from pymongo.results import BulkWriteResult, DeleteResult, UpdateResult

Call = tuple[str, str, tuple, dict]


def Updated(matched: int = 0, modified: int | None = None) -> UpdateResult:
    return UpdateResult({"n": matched, "nModified": matched if modified is None else modified},
                        acknowledged=True)


def Deleted(count: int = 0) -> DeleteResult:
    return DeleteResult({"n": count}, acknowledged=True)


def _bulk_result(ops: list[Any]) -> BulkWriteResult:
    return BulkWriteResult({"nInserted": 0, "nUpserted": len(ops), "nMatched": 0,
                            "nModified": 0, "nRemoved": 0, "upserted": [],
                            "writeErrors": [], "writeConcernErrors": []}, acknowledged=True)


#: The real signature each fake method is bound to (``find`` takes a Cursor's arguments).
_SIGNATURES = {name: inspect.signature(getattr(Collection, name)) for name in (
    "find_one_and_update", "update_many", "delete_many", "bulk_write", "aggregate",
    "count_documents", "create_index", "list_indexes", "drop_index")}
_SIGNATURES["find"] = inspect.signature(Cursor.__init__)
_SIGNATURES["find_one"] = _SIGNATURES["find"]


def bound(method: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by name, as the real pymongo method would take them."""
    owner = (None, None) if method in ("find", "find_one") else (None,)  # self (, collection)
    found = _SIGNATURES[method].bind(*owner, *args, **kwargs)  # a TypeError like pymongo's
    found.apply_defaults()
    return dict(found.arguments)


def _check_documents(method: str, given: dict[str, Any]) -> None:
    """What pymongo checks before it sends: BSON-encodable, a valid update or pipeline."""
    for name in ("filter", "projection", "pipeline"):
        if given.get(name) is not None:
            bson.encode({name: given[name]})
    if "update" in given:
        common.validate_ok_for_update(given["update"])
        bson.encode({"u": given["update"]})
    if given.get("sort") is not None:
        common.validate_list_or_none("sort", given["sort"])


#: The calls that make a collection's indexes on its first use, not queries of its documents.
INDEX_SET_UP = ("create_index", "list_indexes", "drop_index")


class FakeCollection:
    def __init__(self, name: str, calls: list[Call]):
        self.name = name
        self.calls = calls
        self.answers: dict[str, deque[Any]] = defaultdict(deque)
        self.options: dict[str, Any] = {}

    def with_options(self, **options: Any) -> FakeCollection:
        inspect.signature(Collection.with_options).bind(None, **options)
        self.options = options
        return self

    def answer(self, method: str, *values: Any) -> FakeCollection:
        self.answers[method].extend(values)
        return self

    def _call(self, method: str, args: tuple, kwargs: dict, default: Any) -> Any:
        _check_documents(method, bound(method, args, kwargs))
        self.calls.append((self.name, method, args, kwargs))
        queue = self.answers[method]
        value = queue.popleft() if queue else default
        if isinstance(value, Exception):
            raise value
        return value

    def create_index(self, *a: Any, **k: Any) -> Any:
        return self._call("create_index", a, k, "ok")

    def list_indexes(self, *a: Any, **k: Any) -> Any:
        return iter(self._call("list_indexes", a, k, []))

    def drop_index(self, *a: Any, **k: Any) -> Any:
        return self._call("drop_index", a, k, None)

    def find_one_and_update(self, *a: Any, **k: Any) -> Any:
        return self._call("find_one_and_update", a, k, None)

    def update_many(self, *a: Any, **k: Any) -> Any:
        return self._call("update_many", a, k, Updated())

    def delete_many(self, *a: Any, **k: Any) -> Any:
        return self._call("delete_many", a, k, Deleted())

    def bulk_write(self, *a: Any, **k: Any) -> Any:
        return self._call("bulk_write", a, k, _bulk_result(list(a[0]) if a else []))

    def find(self, *a: Any, **k: Any) -> list[Any]:
        found = list(self._call("find", a, k, []))
        limit = bound("find", a, k)["limit"]
        return found[:limit] if limit else found

    def find_one(self, *a: Any, **k: Any) -> Any:
        return self._call("find_one", a, k, None)

    def aggregate(self, *a: Any, **k: Any) -> Any:
        return iter(self._call("aggregate", a, k, []))

    def count_documents(self, *a: Any, **k: Any) -> int:
        return self._call("count_documents", a, k, 0)


class FakeSession:
    """A session whose ``with_transaction`` runs the callback once and records the commit
    (or the abort, when the callback raises). Like pymongo with a client whose URL asks for
    another read preference, it refuses a transaction not told to read from the primary."""

    def __init__(self, log: list[str]):
        self.log = log
        self.in_transaction = False

    def __enter__(self) -> FakeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.log.append("end_session")

    def with_transaction(self, work: Callable[[Any], Any], *,
                         read_preference: Any = None) -> Any:
        if read_preference != ReadPreference.PRIMARY:
            raise InvalidOperation("read preference in a transaction must be primary")
        self.in_transaction = True
        try:
            result = work(self)
        except BaseException:
            self.log.append("abort")
            raise
        finally:
            self.in_transaction = False
        self.log.append("commit")
        return result


class FakeClient:
    def __init__(self) -> None:
        self.transactions: list[str] = []
        self.closed = False

    def start_session(self) -> FakeSession:
        self.transactions.append("start")
        return FakeSession(self.transactions)

    def close(self) -> None:
        self.closed = True


REPLICA_SET = {"setName": "rs0", "localTime": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)}


#: Every FakeDB made in the current test, so conftest.py can check each one's queries.
MADE: list[FakeDB] = []


class FakeDB:
    def __init__(self, hello: dict[str, Any] | Exception | None = None):
        MADE.append(self)
        self.calls: list[Call] = []
        self.collections: dict[str, FakeCollection] = {}
        self.hello = hello or {"isWritablePrimary": True,
                               "localTime": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)}
        self.names: list[str] = []
        self.dropped: list[str] = []
        self.client: Any = FakeClient()
        self.commands: list[tuple[str, tuple, dict]] = []
        """Every command but ``hello``, with its arguments."""
        self.command_answers: deque[Any] = deque()

    def __getitem__(self, name: str) -> FakeCollection:
        if name not in self.collections:
            self.collections[name] = FakeCollection(name, self.calls)
        return self.collections[name]

    def command(self, name: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if name != "hello":
            self.commands.append((name, args, kwargs))
            answer = self.command_answers.popleft() if self.command_answers else {"ok": 1}
            if isinstance(answer, Exception):
                raise answer
            return answer
        if isinstance(self.hello, Exception):
            raise self.hello
        return self.hello

    def list_collection_names(self, filter: Any = None) -> list[str]:
        return list(self.names)

    def drop_collection(self, name: str) -> None:
        self.dropped.append(name)

    def of(self, collection: str, method: str) -> list[tuple[tuple, dict]]:
        """The (args, kwargs) of every call of ``method`` on ``collection``, in order."""
        return [(a, k) for c, m, a, k in self.calls if c == collection and m == method]

    def sequence(self, collection: str) -> list[str]:
        return [m for c, m, _, _ in self.calls if c == collection and m not in INDEX_SET_UP]


def queries(db: FakeDB) -> Iterator[tuple[str, str, dict[str, Any], list[tuple[str, int]]]]:
    """``(collection, method, filter, sort)`` of every query the store sent, writes
    included."""
    for collection, method, args, kwargs in db.calls:
        if method in INDEX_SET_UP:
            continue
        given = bound(method, args, kwargs)
        if method == "bulk_write":
            for op in given["requests"]:
                yield collection, method, op._filter, []
        elif method == "aggregate":
            stages = list(given["pipeline"])
            match = stages.pop(0)["$match"] if stages and "$match" in stages[0] else {}
            sort = list(stages[0]["$sort"].items()) if stages and "$sort" in stages[0] else []
            yield collection, method, match, sort
        else:
            yield collection, method, given.get("filter") or {}, list(given.get("sort") or [])


# --- pymongo's async API over the same recording fake (leaseq.stores.mongodb.aio) ----------


class FakeAsyncCursor:
    def __init__(self, docs: list[Any]):
        self.docs = docs

    async def to_list(self, length: int | None = None) -> list[Any]:
        return list(self.docs)


class FakeAsyncCollection:
    """``AsyncCollection``'s read methods, recorded on the blocking fake's collection (so
    the index check of conftest.py sees them too)."""

    def __init__(self, sync: FakeCollection):
        self.sync = sync

    def with_options(self, **options: Any) -> FakeAsyncCollection:
        self.sync.with_options(**options)
        return self

    async def find_one(self, *a: Any, **k: Any) -> Any:
        return self.sync.find_one(*a, **k)

    async def aggregate(self, *a: Any, **k: Any) -> FakeAsyncCursor:
        return FakeAsyncCursor(list(self.sync.aggregate(*a, **k)))

    def find(self, *a: Any, **k: Any) -> FakeAsyncCursor:
        return FakeAsyncCursor(self.sync.find(*a, **k))


class FakeAsyncDB:
    def __init__(self, db: FakeDB):
        self.db = db
        self.opened = 0
        self.closed = 0

    def __getitem__(self, name: str) -> FakeAsyncCollection:
        return FakeAsyncCollection(self.db[name])

    def opener(self) -> Callable[[], tuple[Any, Callable[[], Any]]]:
        """What ``MongoStore(async_database=...)`` takes: a new "client" per event loop."""
        def open_database() -> tuple[Any, Callable[[], Any]]:
            self.opened += 1
            return self, self._close
        return open_database

    async def _close(self) -> None:
        self.closed += 1
