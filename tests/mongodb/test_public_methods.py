"""Every public method of the MongoDB store is called here at least once against the recording
fake (issue 11, 7: no server runs where these tests run, so no method may go untried). A new
public method without an entry in CALLS fails ``test_every_public_method_has_a_call``; each
call is also an index test (see conftest.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import pytest
from mongo_fakes import FakeAsyncDB, FakeDB, Updated

from leaseq.browse import BulkAction, JobFilter
from leaseq.errors import StoreUnavailable
from leaseq.job import Completion, JobSpec, Lease
from leaseq.ledger import TickAdvance
from leaseq.limits import ClaimLimits, HeldBack
from leaseq.queue import Queue
from leaseq.stores.mongodb import MongoStore
from leaseq.stores.mongodb.connection import parse_url
from leaseq.stores.watch import FINISH_POLL_S

Q = "leaseq_q"
WORKERS = "leaseq__workers"
HOUR = datetime(2024, 5, 1, 10, tzinfo=UTC)
LEASE = Lease("j1", 3, "w")


def doc(job_id: str = "j1", **fields: Any) -> dict[str, Any]:
    return {"_id": job_id, "status": "processing", "attempts": 1, "max_attempts": 5,
            "lease_epoch": 3, "worker_id": "w", **fields}


def spec(job_id: str) -> JobSpec:
    return JobSpec(job_id, {"a": 1}, json.dumps({"a": 1}, separators=(",", ":")))


def from_url(store: MongoStore, db: FakeDB) -> None:
    client = mock.MagicMock()
    client.__getitem__.return_value = db
    with mock.patch("leaseq.stores.mongodb.store.open_client",
                    return_value=(parse_url("mongodb://h/jobs"), client)):
        opened = MongoStore.from_url("mongodb://h/jobs", prefix="leaseq_")
        assert opened.close() is None and client.close.called
        db.hello = StoreUnavailable("down")  # the probe fails: the client is closed again
        client.close.reset_mock()
        with pytest.raises(StoreUnavailable):
            MongoStore.from_url("mongodb://h/jobs")
        assert client.close.called


def with_async(store: MongoStore, db: FakeDB) -> MongoStore:
    """A store over the same fake with the async client (``from_url`` gives one)."""
    return MongoStore(db, url=store.url, async_database=FakeAsyncDB(db).opener())


def deprecated(call: Callable[[], Any]) -> Any:
    with pytest.deprecated_call():
        return call()


LEDGER = "leaseq__schedules"
AT = datetime(2024, 1, 2, 3, 0, tzinfo=UTC)


def ledger_doc(name: str = "hourly", **fields: Any) -> dict[str, Any]:
    return {"_id": name, "queue": "q", "spec": "{}", "cursor": AT, "version": 1,
            "skipped": 0, "paused": False, "active": True, **fields}


def ledger(method: str, *values: Any) -> Callable[[FakeDB], None]:
    return lambda db: db[LEDGER].answer(method, *values)


def answered(method: str, *values: Any) -> Callable[[FakeDB], None]:
    return lambda db: db[Q].answer(method, *values)


#: name → (arrange the fake's answers, the call, what it must return)
CALLS: dict[str, tuple[Callable[[FakeDB], Any], Callable[[MongoStore, FakeDB], Any], Any]] = {
    "cancel": (answered("find_one_and_update", doc(status="cancelled")),
               lambda s, db: s.cancel("q", "j1"), True),
    "claim": (lambda db: (db[Q].answer("find", [{"_id": "j1"}]),
                          db[Q].answer("find_one_and_update", doc())),
              lambda s, db: [j.id for j in s.claim("q", "w", 4, 60)], ["j1"]),
    "claim_one": (answered("find_one_and_update", doc()),
                   lambda s, db: s.claim_one("q", "j1", "w", 60).lease, LEASE),
    "close": (lambda db: None, lambda s, db: s.close(), None),
    "complete": (answered("find_one_and_update", doc(status="done")),
                 lambda s, db: s.complete("q", LEASE, None).status, "done"),
    "complete_many": (answered("find_one_and_update", doc(status="done")),
                      lambda s, db: [j.status for j in s.complete_many(
                          "q", [Completion(LEASE)])], ["done"]),
    "counts": (answered("aggregate", [{"_id": "pending", "n": 2}]),
               lambda s, db: s.counts("q"), {"pending": 2}),
    "drop": (lambda db: setattr(db, "names", [Q]), lambda s, db: (s.drop(), db.dropped),
             (None, [Q])),
    "enqueue_many": (lambda db: None,
                     lambda s, db: [r.outcome.value for r in s.enqueue_many("q", [spec("n")])],
                     ["created"]),
    "fail": (answered("find_one_and_update", doc(status="failed")),
             lambda s, db: s.fail("q", LEASE, "e", "e", "permanent").status, "failed"),
    "forget_limits": (lambda db: None,
                      lambda s, db: (s.forget_limits("q"),
                                     db.of("leaseq_limits", "update_many")[0][0][1]),
                      (None, {"$set": {"key_limit": None, "rate_per_s": None}})),
    "from_url": (lambda db: None, from_url, None),
    "get": (lambda db: None, lambda s, db: s.get("q", "nope"), None),
    "give_back": (answered("find_one_and_update", doc(status="pending", attempts=0)),
                  lambda s, db: s.give_back("q", LEASE, False, "shutdown").status, "pending"),
    "held_back": (lambda db: (db[Q].answer("aggregate", [{"n": 5, "age_ms": 1}],
                                            [{"_id": "k", "ready": 4, "running": 1}]),
                              db["leaseq_limits"].answer("find_one", None)),
                  lambda s, db: s.held_back("q", ClaimLimits(key_limit=2, rate_per_s=1)),
                  HeldBack(by_key=3, by_rate=1)),
    "limited_queues": (lambda db: db["leaseq_limits"].answer("find", [
                           {"_id": "q", "key_limit": 2, "rate_per_s": None},
                           {"_id": "old", "key_limit": None, "rate_per_s": None}]),
                       lambda s, db: s.limited_queues(), {"q": ClaimLimits(key_limit=2)}),
    "heartbeat_many": (answered("update_many", Updated(1)),
                       lambda s, db: s.heartbeat_many("q", [LEASE], 60), []),
    "in_flight": (answered("count_documents", 2), lambda s, db: s.in_flight("q"), 2),
    "journal": (lambda db: db["leaseq_journal"].answer("find", [
                    {"job_id": "j1", "event": "claimed", "attempt": 1}]),
                lambda s, db: [e.event for e in s.journal("q", "j1")], ["claimed"]),
    "list_jobs": (answered("find", [doc("a"), doc("b")]),
             lambda s, db: [j.id for j in s.list_jobs("q", "processing", limit=1)], ["a"]),
    "mark_published": (lambda db: (db[Q].answer("find", [doc("j1", status="pending")]),
                                   db[Q].answer("update_many", Updated(1))),
                       lambda s, db: s.mark_published("q", [LEASE]), ["j1"]),
    "migrate": (lambda db: (setattr(db, "names", [Q, "leaseq_journal", "leaseq_bad name"]),
                            db[Q].answer("find_one", {"_id": "x"}, {"_id": "x"})),
                lambda s, db: (s.migrate(), s.queues()), (1, ["q"])),
    "notify_local": (lambda db: None,
                     lambda s, db: (s.notify_local("q"), s.wait_for_work(["q"], 0.0)),
                     (None, True)),
    "oldest_pending_age_s": (answered("aggregate", [{"n": 1, "age_ms": 2500}]),
                             lambda s, db: s.oldest_pending_age_s("q"), 2.5),
    "outbox_due": (answered("find", [doc("a", status="pending")]),
                   lambda s, db: [j.id for j in s.outbox_due("q", 10)], ["a"]),
    "prepare_outbox": (lambda db: None, lambda s, db: s.prepare_outbox(), None),
    "purge": (lambda db: (db[Q].answer("find", [{"_id": "a"}], [], []),
                          db[Q].answer("delete_many", mock.Mock(deleted_count=1))),
              lambda s, db: s.purge("q", {"done": 60}), 1),
    "queue": (lambda db: None, lambda s, db: isinstance(s.queue("q"), Queue), True),
    "queues": (lambda db: setattr(db, "names", [Q, "leaseq_empty"]),
               lambda s, db: s.queues(), []),
    "ready": (answered("aggregate", [{"n": 7, "age_ms": 1}]), lambda s, db: s.ready("q"), 7),
    "ready_stats": (answered("aggregate", []), lambda s, db: s.ready_stats("q"), (0, 0.0)),
    "reclaim_expired": (lambda db: None, lambda s, db: s.reclaim_expired("q"), (0, 0)),
    "append_journal": (lambda db: None, lambda s, db: s.append_journal(
        "q", "j1", "ack_sent", reason="acked", data={"n": 1}), None),
    "republish": (answered("update_many", Updated(3, 3)),
                  lambda s, db: s.republish("q", 600), 3),
    "reowe_publish": (lambda db: (db[Q].answer("find", [doc(status="pending")]),
                                  db[Q].answer("update_many", Updated(1, 1))),
                      lambda s, db: s.reowe_publish("q", ["j1"]), ["j1"]),
    "requeue": (answered("find_one_and_update", doc(status="pending")),
                lambda s, db: s.requeue("q", "j1"), True),
    "retry_later": (answered("find_one_and_update", doc(status="pending")),
                    lambda s, db: s.retry_later("q", LEASE, "e", "e", 9).status, "pending"),
    "schema_version": (lambda db: setattr(db, "names", ["leaseq_journal"]),
                       lambda s, db: s.schema_version(), 1),
    "server_now": (lambda db: None, lambda s, db: s.server_now().year, 2024),
    "snooze": (answered("find_one_and_update", doc(status="pending")),
               lambda s, db: s.snooze("q", LEASE, 5).status, "pending"),
    "wait_for_work": (lambda db: None, lambda s, db: s.wait_for_work(["q"], 0.0), False),
    # the async API (leaseq.aio; stores/mongodb/aio.py): native reads, writes on a thread
    "aenqueue_many": (lambda db: None, lambda s, db: [r.outcome.value for r in asyncio.run(
        s.aenqueue_many("q", [spec("n")]))], ["created"]),
    "aget": (answered("find_one", doc()),
             lambda s, db: asyncio.run(with_async(s, db).aget("q", "j1")).lease, LEASE),
    "acounts": (answered("aggregate", [{"_id": "done", "n": 4}]),
                lambda s, db: asyncio.run(with_async(s, db).acounts("q")), {"done": 4}),
    "ajournal": (lambda db: db["leaseq_journal"].answer("find", [
                     {"job_id": "j1", "event": "claimed", "attempt": 1}]),
                 lambda s, db: [e.event for e in asyncio.run(
                     with_async(s, db).ajournal("q", "j1"))], ["claimed"]),
    "arequeue": (answered("find_one_and_update", doc(status="pending")),
                 lambda s, db: asyncio.run(s.arequeue("q", "j1")), True),
    "acancel": (answered("find_one_and_update", doc(status="cancelled")),
                lambda s, db: asyncio.run(s.acancel("q", "j1")), True),
    "aclose": (lambda db: None, lambda s, db: asyncio.run(with_async(s, db).aclose()), None),
    "watch_finish": (lambda db: None,
                     lambda s, db: s.watch_finish("q", "j1").poll_s, FINISH_POLL_S),
    # the deprecated names (leaseq.deprecated): each warns, then answers as its new name
    "list": (answered("find", [doc("a")]),
             lambda s, db: deprecated(lambda: [j.id for j in s.list("q")]), ["a"]),
    "retry": (answered("find_one_and_update", doc(status="pending")),
              lambda s, db: deprecated(lambda: s.retry("q", "j1")), True),
    "claim_id": (answered("find_one_and_update", doc()),
                 lambda s, db: deprecated(lambda: s.claim_id("q", "j1", "w", 60).lease), LEASE),
    "record": (lambda db: None,
               lambda s, db: deprecated(lambda: s.record("q", "j1", "ack_sent", reason="x")),
               None),
    "register_schedule": (lambda db: (ledger("find_one_and_update", None)(db),
                                      ledger("find_one", ledger_doc())(db)),
                          lambda s, db: s.register_schedule("hourly", "q", "{}").version, 1),
    "schedule_state": (ledger("find_one", None),
                       lambda s, db: s.schedule_state("hourly"), None),
    "schedules": (ledger("find", [ledger_doc("a"), ledger_doc("b", active=False)]),
                  lambda s, db: [(x.name, x.active) for x in s.schedules()],
                  [("a", True), ("b", False)]),
    "advance_schedule": (ledger("find_one_and_update", None),
                         lambda s, db: s.advance_schedule(
                             "hourly", 1, TickAdvance(AT + timedelta(hours=1))), False),
    "trigger_schedule": (ledger("find_one_and_update", None),
                         lambda s, db: s.trigger_schedule(
                             "hourly", "q", JobSpec("hourly@manual", {}, "{}")), False),
    "pause_schedule": (ledger("find_one_and_update", ledger_doc(paused=True)),
                       lambda s, db: s.pause_schedule("hourly", True), True),
    "deactivate_schedules": (lambda db: (ledger("find", [ledger_doc("old")])(db),
                                         ledger("find_one_and_update", ledger_doc("old"))(db)),
                             lambda s, db: s.deactivate_schedules(["q"], ["new"]), ["old"]),

    "find_jobs": (answered("find", [{"_id": "a", "task": "t"}, {"_id": "b"}], [doc("a")]),
                  lambda s, db: [j.id for j in s.find_jobs(JobFilter("q", task="t")).jobs],
                  ["a"]),
    "snapshot_ids": (answered("find", [{"_id": "a"}], [doc("a")]),
                     lambda s, db: s.snapshot_ids(JobFilter("q")), ["a"]),
    "act_on_jobs": (answered("find_one_and_update", doc("a", status="cancelled"), None),
                    lambda s, db: dataclasses.astuple(
                        s.act_on_jobs("q", BulkAction.CANCEL, ["a", "b"], "me")),
                    (["a"], ["b"])),
    "requeue_edited": (lambda db: (db[Q].answer("find_one", doc(a=1)),
                                   db[Q].answer("find_one_and_update", doc(status="pending"))),
                       lambda s, db: s.requeue_edited("q", "j1", '{"b":2}', "me"), True),
    "journal_hourly": (lambda db: db["leaseq_journal"].answer("aggregate", [
                           {"_id": {"hour": HOUR, "event": "claimed"}, "n": 3}]),
                       lambda s, db: [(c.hour, c.event, c.count)
                                      for c in s.journal_hourly("q", 2)],
                       [(HOUR, "claimed", 3)]),
    "journal_counts": (lambda db: db["leaseq_journal"].answer("aggregate", [
                           {"_id": "quarantined", "n": 2}, {"_id": "result_saved", "n": 5}]),
                       lambda s, db: s.journal_counts("q", 3600),
                       {"quarantined": 2, "result_saved": 5}),
    "queue_summary": (lambda db: (db[Q].answer("count_documents", 3, 0, 5, 0, 0, 2),
                                  db[Q].answer("aggregate", [{"n": 6, "age_ms": 60_000}])),
                      lambda s, db: (lambda r: ({k: str(c) for k, c in r.counts.items()},
                                                str(r.ready), r.oldest_ready_s > 0,
                                                str(r.lapsed)))(
                          s.queue_summary("q", cap=5)),
                      ({"pending": "3", "processing": "0", "done": "5+", "failed": "0",
                        "cancelled": "0"}, "5+", True, "2")),
    "table_health": (lambda db: None, lambda s, db: s.table_health(), []),
    "index_health": (lambda db: None, lambda s, db: s.index_health(), []),
    "register_worker": (lambda db: None, lambda s, db: s.register_worker("w", ["q"], 1), None),
    "unregister_worker": (lambda db: None, lambda s, db: s.unregister_worker("w"), None),
    "list_workers": (lambda db: db[WORKERS].answer("find", [
                         {"_id": "w", "queues": ["q"], "in_flight": 1, "started_at": HOUR,
                          "last_beat_at": HOUR}]),
                     lambda s, db: [(w.worker_id, w.queues, w.in_flight, w.last_beat_at)
                                    for w in s.list_workers()],
                     [("w", ["q"], 1, HOUR)]),
    "prune_workers": (lambda db: db[WORKERS].answer("delete_many", mock.Mock(deleted_count=2)),
                      lambda s, db: s.prune_workers(60), 2),
}


def public_methods() -> set[str]:
    return {name for name, value in inspect.getmembers(MongoStore)
            if not name.startswith("_") and callable(value)}


def test_every_public_method_has_a_call():
    assert set(CALLS) == public_methods()


@pytest.mark.parametrize("name", sorted(CALLS))
def test_each_public_method_runs_against_the_recording_fake(name, db, monkeypatch):
    # Given a store over the recording fake and the answers this call needs
    store = MongoStore(db, url="mongodb://u:pw@h/db", client=db.client)
    arrange, call, expected = CALLS[name]
    arrange(db)
    called: list[str] = []
    real = inspect.getattr_static(MongoStore, name)
    func = real.__func__ if isinstance(real, classmethod) else real

    def spy(*args: Any, **kwargs: Any) -> Any:
        called.append(name)
        return func(*args, **kwargs)

    monkeypatch.setattr(MongoStore, name, classmethod(spy) if isinstance(real, classmethod)
                        else spy)
    # When it is called  Then it ran and answered what the fake's answers imply
    assert call(store, db) == expected
    assert name in called
