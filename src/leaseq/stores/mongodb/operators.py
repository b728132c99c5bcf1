"""The MongoDB store's operators' tools (DESIGN.md §8): the filtered job page, bulk actions,
edit-and-requeue, journal counts per hour and the worker registry.

Mixed into ``MongoStore``, whose plumbing (``_coll``, ``_log``, ``_journal``, ``_db``) it uses.
Filters the indexes do not bound (task beside a status, id prefix, error text, time range) are
checked here on the walked documents, at most ``SCAN_CAP`` per page (``browse.walk``). A bulk
action changes each job with its own guarded ``find_one_and_update``: atomic per job, as
every write of this store, and committed with its journal entry where the deployment has
transactions.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from pymongo import ReturnDocument

from leaseq.browse import (
    ACTION_EVENTS,
    COUNT_CAP,
    SUMMARY_STATUSES,
    BulkAction,
    BulkResult,
    Count,
    Fetch,
    HourlyCount,
    JobFilter,
    JobPage,
    KeyRow,
    QueueSummary,
    WorkerInfo,
    actor_reason,
    batches,
    prefix_end,
    time_key,
    walk,
)
from leaseq.errors import JobNotFound
from leaseq.journal import HOURLY_UNCOUNTED, JournalEvent
from leaseq.stores.mongodb import documents, records
from leaseq.stores.mongodb.connection import OffsetClock, guarded
from leaseq.stores.mongodb.records import Event, JournalWriter

AFTER = ReturnDocument.AFTER
#: What a page walk reads of each document: enough to decide the filters, never the payload.
WALK_PROJECTION = {"_id": 1, "updated_at": 1, "task": 1, "error": 1}
RECENT_SORT = [("updated_at", -1), ("_id", -1)]
#: The journal entries of one job's change, from its document after the change.
Entries = Callable[[Mapping[str, Any]], list[Event]]


class OperatorTools(OffsetClock):
    """The operators' primitives of the store protocol (see ``leaseq.stores.base``)."""

    _db: Any
    _prefix: str
    _journal: Any
    _coll: Callable[[str], Any]
    _ready: Callable[[str], dict[str, Any]]
    _log: JournalWriter
    _transaction: Callable[[Callable[[Any], Any]], Any]
    _create_indexes: Callable[..., None]
    _indexes_on_use: bool
    server_now: Callable[[], Any]

    # --- the job page -------------------------------------------------------------------------

    @guarded
    def find_jobs(self, where: JobFilter, limit: int = 50,
                  cursor: str | None = None) -> JobPage:
        ids, next_cursor, capped = walk(self._walker(where), limit, cursor, read_key=time_key)
        coll = self._coll(where.queue)
        docs = {d["_id"]: d for d in coll.find({"_id": {"$in": ids}})} if ids else {}
        jobs = [records.job(where.queue, docs[i]) for i in ids if i in docs]
        return JobPage(jobs, next_cursor, capped)

    def _walker(self, where: JobFilter) -> Fetch:
        coll = self._coll(where.queue)

        def fetch(key: Any, after_id: str | None, n: int) -> list[KeyRow]:
            query, sort = walk_query(where, key, after_id)
            docs = coll.find(query, WALK_PROJECTION, sort=sort, limit=n)
            return [(_key(d) if where.status else None, d["_id"], matches(where, d))
                    for d in docs]
        return fetch

    # --- bulk actions -------------------------------------------------------------------------

    @guarded
    def act_on_jobs(self, queue: str, action: BulkAction, job_ids: Sequence[str],
                    actor: str) -> BulkResult:
        action = BulkAction(action)
        reason = actor_reason(actor)
        acted: list[str] = []

        def entry(doc: Mapping[str, Any]) -> list[Event]:
            return [Event(queue, doc["_id"], ACTION_EVENTS[action], records.moved(doc, reason))]

        for batch in batches(job_ids):
            changed = (self._delete_terminal(queue, batch, entry)
                       if action is BulkAction.DELETE
                       else self._move_each(queue, action, batch, entry))
            acted.extend(d["_id"] for d in changed)
        return BulkResult.of(job_ids, acted)

    def _move_each(self, queue: str, action: BulkAction, ids: list[str],
                   entry: Entries) -> list[Any]:
        """Each job in a transaction of its own: in one for the batch, a write conflict with
        any one job's worker would abort every job's change."""
        guard, update = ((documents.operator_requeueable, documents.operator_requeue(self._off))
                         if action is BulkAction.REQUEUE
                         else (documents.cancellable, documents.operator_cancel(self._off)))
        moved = (self._change_logged(queue, guard(job_id), update, entry) for job_id in ids)
        return [doc for doc in moved if doc is not None]

    def _delete_terminal(self, queue: str, ids: list[str], entry: Entries) -> list[Any]:
        """One batch's delete and its entries in one transaction where the deployment has
        them, as on the SQL stores (one statement deletes the batch)."""
        coll = self._coll(queue)  # indexes before any transaction
        query = {"_id": {"$in": ids}, "status": {"$nin": [documents.PENDING, documents.PROCESSING]}}

        def work(session: Any) -> list[Any]:
            found = list(coll.find(query, {"_id": 1, "attempts": 1, "lease_epoch": 1},
                                   session=session))
            if not found:
                return []
            coll.delete_many({**query, "_id": {"$in": [d["_id"] for d in found]}},
                             session=session)
            left = {d["_id"] for d in coll.find({"_id": {"$in": ids}}, {"_id": 1},
                                                session=session)}
            gone = [d for d in found if d["_id"] not in left]
            self._log([e for d in gone for e in entry(d)], session)
            return gone

        return list(self._transaction(work))

    @guarded
    def requeue_edited(self, queue: str, job_id: str, payload_json: str, actor: str) -> bool:
        update = edit_payload(json.loads(payload_json), self._off)

        def entries(doc: Mapping[str, Any]) -> list[Event]:
            fields = records.moved(doc, actor_reason(actor))
            return [Event(queue, job_id, JournalEvent.EDITED, fields),
                    Event(queue, job_id, JournalEvent.REQUEUED, fields)]

        return self._changed_or_missing(queue, job_id, self._change_logged(
            queue, documents.operator_requeueable(job_id), update, entries))

    def _change_logged(self, queue: str, query: Mapping[str, Any],
                       update: list[dict[str, Any]], entries: Entries) -> Any:
        """An operator's change of one job (the document after it, None when ``query``
        matched nothing) and its journal ``entries``, in one transaction where the
        deployment has them, as every state change (DESIGN.md §8): a failure between the
        two must not leave a job changed with no word of it in its story."""
        coll = self._coll(queue)  # indexes before any transaction

        def work(session: Any) -> Any:
            doc = coll.find_one_and_update(query, update, return_document=AFTER,
                                           session=session)
            if doc is not None:
                self._log(entries(doc), session)
            return doc

        return self._transaction(work)

    def _changed_or_missing(self, queue: str, job_id: str, doc: Any) -> bool:
        """True when the operator's change was made; False when the job is there but the
        change does not fit it; ``JobNotFound`` when there is no such job."""
        if doc is not None:
            return True
        if self._coll(queue).find_one({"_id": job_id}, {"_id": 1}) is None:
            raise JobNotFound(queue, job_id)
        return False

    # --- journal per hour -----------------------------------------------------------------

    @guarded
    def journal_hourly(self, queue: str, hours: int) -> list[HourlyCount]:
        now = self.server_now()
        since = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours - 1)
        rows = self._journal.aggregate(hourly(queue, since))
        # a date: $dateTrunc makes each group's hour from the entry's at
        return [HourlyCount(records.dt(r["_id"]["hour"]),  # type: ignore[arg-type]
                            r["_id"]["event"], int(r["n"])) for r in rows]

    @guarded
    def journal_counts(self, queue: str, within_s: float) -> dict[str, int]:
        since = self.server_now() - timedelta(seconds=float(within_s))
        return {r["_id"]: int(r["n"]) for r in self._journal.aggregate(counted(queue, since))}

    # --- bounded counts -------------------------------------------------------------------

    @guarded
    def queue_summary(self, queue: str, cap: int = COUNT_CAP) -> QueueSummary:
        coll = self._coll(queue)
        counts = {status: _count(coll.count_documents({"status": status}, limit=cap), cap)
                  for status in SUMMARY_STATUSES}
        # The oldest ready job by not-before, whatever its priority: no index yields that
        # order (the claim index sorts by priority first), so the $min of ready_stats'
        # aggregation, which counts the ready jobs on the way
        stats = self._ready(queue)
        ready = _count(min(int(stats["n"]), cap), cap)
        lapsed = _count(coll.count_documents(documents.lapsed(self._off), limit=cap), cap)
        return QueueSummary(queue, counts, ready, records.ready_age_s(stats), lapsed)

    # --- the worker registry ----------------------------------------------------------------

    @property
    def _workers(self) -> Any:
        # A leading "_" after the prefix: no queue name can start so, so no queue's collection
        # can take this name.
        coll = self._db[self._prefix + "_workers"]
        if self._indexes_on_use and not getattr(self, "_workers_indexed", False):
            self._create_indexes(coll, [([("last_beat_at", 1)], {"name": "last_beat_at_1"})])
            self._workers_indexed = True
        return coll

    @guarded
    def register_worker(self, worker_id: str, queues: Sequence[str], in_flight: int) -> None:
        self._workers.find_one_and_update(
            {"_id": worker_id}, beat(list(queues), in_flight, self._off), upsert=True)

    @guarded
    def unregister_worker(self, worker_id: str) -> None:
        self._workers.delete_many({"_id": worker_id})

    @guarded
    def list_workers(self, limit: int = 1000) -> list[WorkerInfo]:
        docs = self._workers.find({}, sort=[("_id", 1)], limit=limit)
        # dates: every beat() upsert writes last_beat_at, and started_at when it is missing
        return [WorkerInfo(d["_id"], list(d.get("queues") or []), int(d.get("in_flight") or 0),
                           records.dt(d.get("started_at")),  # type: ignore[arg-type]  # beat()
                           records.dt(d.get("last_beat_at")))  # type: ignore[arg-type]  # beat()
                for d in docs]

    @guarded
    def prune_workers(self, older_than_s: float) -> int:
        query = {"$expr": {"$lt": ["$last_beat_at", documents.now(self._off, -older_than_s)]}}
        return int(self._workers.delete_many(query).deleted_count)


# --- documents --------------------------------------------------------------------------------


def _count(n: int, cap: int) -> Count:
    return Count(n, exact=n < cap)


def walk_query(where: JobFilter, key: Any,
               after_id: str | None) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    """The index walk for ``where`` from a position: status → newest first on
    ``(status, updated_at, _id)``; task → ``(task, _id)``; else the ``_id`` index, bounded
    to the id prefix when there is one."""
    if where.status:
        query: dict[str, Any] = {"status": where.status}
        if after_id is not None and key is None:
            # An adopted document without updated_at: those sort last, by id.
            query.update({"updated_at": None, "_id": {"$lt": after_id}})
        elif after_id is not None:
            at = datetime.fromisoformat(key)
            query["$or"] = [{"updated_at": {"$lt": at}},
                            {"updated_at": at, "_id": {"$lt": after_id}},
                            {"updated_at": None}]
        return query, RECENT_SORT
    ids: dict[str, Any] = {"$gt": after_id or ""}
    if where.task:
        return {"task": where.task, "_id": ids}, [("_id", 1)]
    if where.id_prefix:
        ids.update({"$gte": where.id_prefix, "$lt": prefix_end(where.id_prefix)})
    return {"_id": ids}, [("_id", 1)]


def matches(where: JobFilter, doc: Mapping[str, Any]) -> bool:
    """The filters the walk's index did not bound, checked on a walked document."""
    updated = records.dt(doc.get("updated_at"))
    if where.task and doc.get("task") != where.task:
        return False
    if where.id_prefix and not str(doc["_id"]).startswith(where.id_prefix):
        return False
    if where.error_text and where.error_text.lower() not in str(doc.get("error") or "").lower():
        return False
    if where.updated_from and (updated is None or updated < where.updated_from):
        return False
    return not (where.updated_until and (updated is None or updated >= where.updated_until))


def _key(doc: Mapping[str, Any]) -> str | None:
    updated = records.dt(doc.get("updated_at"))
    return updated.isoformat() if updated else None


def edit_payload(new: Mapping[str, Any], offset_s: float) -> list[dict[str, Any]]:
    """An operator retry that also swaps the payload, in one update: the app's fields live at
    the top level of the document, so it is replaced by its record fields beside the new
    payload (whatever payload it holds when the update runs, not when it was last read)."""
    return [{"$replaceWith": {"$mergeObjects": [documents.RECORD_OF_ROOT, documents.lit(new)]}},
            *documents.operator_requeue(offset_s)]


def counted(queue: str, since: datetime) -> list[dict[str, Any]]:
    """``journal_counts``: the counted events since ``since``, per event."""
    return [_counted_since(queue, since), {"$group": {"_id": "$event", "n": {"$sum": 1}}}]


def _counted_since(queue: str, since: datetime) -> dict[str, Any]:
    return {"$match": {"queue": queue, "at": {"$gte": since},
                       "event": {"$nin": list(HOURLY_UNCOUNTED)}}}


def hourly(queue: str, since: datetime) -> list[dict[str, Any]]:
    return [
        _counted_since(queue, since),
        {"$group": {"_id": {"hour": {"$dateTrunc": {"date": "$at", "unit": "hour"}},
                            "event": "$event"}, "n": {"$sum": 1}}},
        {"$sort": {"_id.hour": 1, "_id.event": 1}},
    ]


def beat(queues: list[str], in_flight: int, offset_s: float) -> list[dict[str, Any]]:
    return [{"$set": {"queues": documents.lit(queues), "in_flight": documents.lit(in_flight),
                      "last_beat_at": documents.now(offset_s),
                      "started_at": {"$ifNull": ["$started_at", documents.now(offset_s)]}}}]

