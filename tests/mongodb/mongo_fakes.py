"""A recording stand-in for pymongo's database and collections.

Store-specific on purpose: no MongoDB server can run where these tests run, and mongomock
does not evaluate ``$$NOW``, ``$dateAdd`` or pipeline updates faithfully. These fakes check the
store's control flow (which statement, with which builder's document, in which order, and what
it does with the answer); the documents themselves are asserted in test_documents.py, and the
semantics on a real server by the conformance suite (LEASEQ_TEST_MONGODB_URL).
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


@dataclass
class Result:
    matched_count: int = 0
    modified_count: int = 0
    deleted_count: int = 0


class Cursor(list):
    def sort(self, *args: Any, **kwargs: Any) -> Cursor:
        return self

    def limit(self, n: int) -> Cursor:
        return Cursor(self[:n])


class FakeCollection:
    def __init__(self, name: str, calls: list[tuple[str, str, tuple, dict]]):
        self.name = name
        self.calls = calls
        self.answers: dict[str, deque[Any]] = defaultdict(deque)

    def answer(self, method: str, *values: Any) -> FakeCollection:
        self.answers[method].extend(values)
        return self

    def _call(self, method: str, args: tuple, kwargs: dict, default: Any) -> Any:
        self.calls.append((self.name, method, args, kwargs))
        queue = self.answers[method]
        value = queue.popleft() if queue else default
        if isinstance(value, Exception):
            raise value
        return value

    def create_index(self, *a: Any, **k: Any) -> Any:
        return self._call("create_index", a, k, "ok")

    def find_one_and_update(self, *a: Any, **k: Any) -> Any:
        return self._call("find_one_and_update", a, k, None)

    def update_many(self, *a: Any, **k: Any) -> Any:
        return self._call("update_many", a, k, Result())

    def delete_many(self, *a: Any, **k: Any) -> Any:
        return self._call("delete_many", a, k, Result())

    def bulk_write(self, *a: Any, **k: Any) -> Any:
        return self._call("bulk_write", a, k, Result())

    def find(self, *a: Any, **k: Any) -> Cursor:
        return Cursor(self._call("find", a, k, []))

    def find_one(self, *a: Any, **k: Any) -> Any:
        return self._call("find_one", a, k, None)

    def aggregate(self, *a: Any, **k: Any) -> Any:
        return iter(self._call("aggregate", a, k, []))


class FakeDB:
    def __init__(self, hello: dict[str, Any] | None = None):
        self.calls: list[tuple[str, str, tuple, dict]] = []
        self.collections: dict[str, FakeCollection] = {}
        self.hello = hello or {"isWritablePrimary": True,
                               "localTime": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)}
        self.names: list[str] = []
        self.dropped: list[str] = []
        self.client = None

    def __getitem__(self, name: str) -> FakeCollection:
        if name not in self.collections:
            self.collections[name] = FakeCollection(name, self.calls)
        return self.collections[name]

    def command(self, name: str) -> dict[str, Any]:
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
        return [m for c, m, _, _ in self.calls if c == collection and m != "create_index"]
