"""The schedule ledger on MongoDB: one document per schedule in ``{prefix}_schedules`` (a
name no queue can have: queue names start with a letter or digit), every write one
``find_one_and_update`` keyed by ``_id``.

No transaction ties an advance to its jobs here, so the compare-and-set writes the jobs it
decided into the document as an *intent*, in the same single-document write as the new
cursor; the jobs are then upserted (idempotent by id) and the intent cleared. A scheduler
that dies in between leaves the intent, and the next ``schedule_state`` — which every
scheduler calls before it plans — writes those jobs first. A tick is never lost, and never
two jobs: the CAS lets one advance through, and the upserts are keyed by the tick's job id.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from leaseq.errors import InvalidPayload, InvalidQueueName
from leaseq.job import JobSpec
from leaseq.journal import OPERATOR, SCHEDULE_CHANGED, SCHEDULE_GONE, SCHEDULE_REGISTERED
from leaseq.ledger import (
    REVIVE_GRACE_S,
    ScheduleEvent,
    ScheduleState,
    TickAdvance,
    format_tick,
    owned,
    schedule_changes,
    schedule_journal_id,
)
from leaseq.stores.mongodb import records, upserts
from leaseq.stores.mongodb.connection import OffsetClock, guarded
from leaseq.stores.mongodb.documents import lit, now
from leaseq.stores.mongodb.records import Event, JournalWriter

AFTER, BEFORE = ReturnDocument.AFTER, ReturnDocument.BEFORE
Doc = dict[str, Any]
#: What enqueue raises for a job it will never take, whatever is stored.
_NEVER_STORED = (InvalidPayload, InvalidQueueName)

log = logging.getLogger(__name__)


class ScheduleLedger(OffsetClock):
    """The ledger primitives of ``Store``, mixed into ``MongoStore``."""

    _prefix: str
    _primary: Any
    _log: JournalWriter
    enqueue_many: Any

    @property
    def _ledger(self) -> Any:
        return self._primary(self._prefix + "_schedules")

    @guarded
    def register_schedule(self, name: str, queue: str, spec_json: str,
                          queues: Sequence[str] = ()) -> ScheduleState:
        before = self._insert_schedule(name, queue, spec_json)
        if before is None:
            self._log_schedule(queue, name, ScheduleEvent.REGISTERED, SCHEDULE_REGISTERED)
        elif _differs(before, queue, spec_json) and _takes(before, [queue, *queues]):
            changed = self._ledger.find_one_and_update(
                {"_id": name, "version": before["version"]},
                [{"$set": {"spec": lit(spec_json), "queue": lit(queue), "active": True,
                           "cursor": self._reactivated_cursor(), **self._bumped()}}],
                return_document=AFTER)
            if changed is not None:  # else another registrar changed it first, and logged it
                self._log_schedule(queue, name, ScheduleEvent.CHANGED, SCHEDULE_CHANGED,
                                   schedule_changes(before, queue, spec_json))
        return owned(_state(self._ledger.find_one({"_id": name})), queue)

    def _reactivated_cursor(self) -> Doc:
        """A reactivation after ``REVIVE_GRACE_S`` inactive moves the cursor to now, as a
        resume does: the ticks of the time the schedule was not in the code never fire.
        Sooner (a rolling deploy's old scheduler retired it), the cursor stays."""
        gone_long = {"$and": [{"$not": ["$active"]},
                              {"$lt": ["$updated_at", now(self._off, -REVIVE_GRACE_S)]}]}
        return {"$cond": [gone_long, {"$max": ["$cursor", now(self._off)]}, "$cursor"]}

    def _insert_schedule(self, name: str, queue: str, spec_json: str) -> Doc | None:
        """The document before this call (None: it was inserted now, cursor = now)."""
        kept = {field: {"$ifNull": [f"${field}", value]} for field, value in {
            "queue": lit(queue), "spec": lit(spec_json), "cursor": now(self._off),
            "version": 0, "skipped": 0, "paused": False, "active": True,
            "created_at": now(self._off), "updated_at": now(self._off)}.items()}
        for tries_left in (1, 0):
            try:
                return self._ledger.find_one_and_update(
                    {"_id": name}, [{"$set": kept}], upsert=True, return_document=BEFORE)
            except DuplicateKeyError:  # a concurrent registrar inserted it first
                if not tries_left:
                    raise
        return None  # pragma: no cover - the loop returns or raises

    @guarded
    def schedule_state(self, name: str) -> ScheduleState | None:
        doc = self._ledger.find_one({"_id": name})
        if doc is None:
            return None
        if doc.get("intent"):
            doc = self._settle(doc)
        return _state(doc)

    def _settle(self, doc: Doc) -> Doc:
        """Write the jobs an advance promised (idempotent by id), then clear its intent."""
        intent = doc["intent"]
        try:
            self.enqueue_many(doc["queue"], [_spec(j) for j in intent["jobs"]],
                              on_conflict="keep")
        except _NEVER_STORED:
            self._settle_each(doc["queue"], doc["_id"], intent["jobs"])
        cleared = self._ledger.find_one_and_update(
            {"_id": doc["_id"], "intent.version": intent["version"]},
            {"$unset": {"intent": ""}}, return_document=AFTER)
        return cleared or {**doc, "intent": None}

    def _settle_each(self, queue: str, name: str, jobs: Sequence[Doc]) -> None:
        """An intent the store refuses a job of (one left by code that did not check the
        ticks before the CAS): each job on its own, and a refused one dropped, journalled
        ``ticks_missed`` with why and logged. Kept, it would be refused again at every read
        and stop the schedule for good; the jobs of the other ticks are still written."""
        for job in jobs:
            try:
                self.enqueue_many(queue, [_spec(job)], on_conflict="keep")
            except _NEVER_STORED as exc:
                # a date: _intent_job writes each job's tick
                tick = format_tick(records.dt(job["tick"]))  # type: ignore[arg-type]
                log.error("schedule %s: tick %s dropped, its job %s cannot be stored: %s",
                          name, tick, job["id"], exc, extra={
                              "action": "schedule_tick_dropped", "schedule": name,
                              "job_id": job["id"]})
                self._log_schedule(queue, name, ScheduleEvent.TICKS_MISSED,
                                   f"the store cannot take the tick's job: {exc}"[:500],
                                   {"count": 1, "first": tick, "last": tick, "job": job["id"]})

    @guarded
    def schedules(self) -> list[ScheduleState]:
        return [_state(d) for d in self._ledger.find({}, sort=[("_id", 1)])]

    @guarded
    def advance_schedule(self, name: str, version: int, advance: TickAdvance) -> bool:
        # Before the CAS: an intent the store refuses would be retried at every read
        upserts.refuse_unstorable([spec for _, spec in advance.jobs])
        last_tick, last_job = advance.last or (None, None)
        jobs = [_intent_job(tick, spec) for tick, spec in advance.jobs]
        doc = self._ledger.find_one_and_update(
            {"_id": name, "version": version, "paused": False, "active": True,
             "cursor": {"$lt": advance.cursor}},
            [{"$set": {
                "cursor": lit(advance.cursor),
                "last_tick": {"$ifNull": [lit(last_tick), "$last_tick"]},
                "last_job_id": {"$ifNull": [lit(last_job), "$last_job_id"]},
                "skipped": {"$add": ["$skipped", len(advance.skipped)]},
                "intent": lit({"version": version + 1, "jobs": jobs}) if jobs else "$$REMOVE",
                **self._bumped()}}],
            return_document=AFTER)
        if doc is None:
            return False
        self._log([Event(doc["queue"], schedule_journal_id(name), event,
                          {"reason": reason, "data": data})
                   for event, reason, data in advance.journal()])
        if jobs:
            self._settle(doc)
        return True

    @guarded
    def trigger_schedule(self, name: str, queue: str, spec: JobSpec) -> bool:
        upserts.refuse_unstorable([spec])  # else the record would name a job never written
        # The record first: a crash before the job leaves a last job that is not live
        if self._ledger.find_one_and_update(
                {"_id": name, "queue": queue},
                [{"$set": {"last_job_id": lit(spec.job_id), **self._bumped_by_operator()}}],
                return_document=AFTER) is None:
            return False
        self.enqueue_many(queue, [spec], on_conflict="keep")
        self._log_schedule(queue, name, ScheduleEvent.TICK_MANUAL, OPERATOR,
                           {"job": spec.job_id})
        return True

    @guarded
    def pause_schedule(self, name: str, paused: bool) -> bool:
        cursor = "$cursor" if paused else {"$max": ["$cursor", now(self._off)]}
        doc = self._ledger.find_one_and_update(
            {"_id": name, "paused": not paused},
            [{"$set": {"paused": paused, "cursor": cursor, **self._bumped_by_operator()}}],
            return_document=AFTER)
        if doc is None:
            return False
        event = ScheduleEvent.PAUSED if paused else ScheduleEvent.RESUMED
        self._log_schedule(doc["queue"], name, event, OPERATOR)
        return True

    @guarded
    def deactivate_schedules(self, queues: Sequence[str], keep: Sequence[str]) -> list[str]:
        gone = []
        for doc in self._ledger.find({}, sort=[("_id", 1)]):
            if not doc.get("active") or doc["queue"] not in queues or doc["_id"] in keep:
                continue
            if self._ledger.find_one_and_update(
                    {"_id": doc["_id"], "version": doc["version"]},
                    [{"$set": {"active": False, **self._bumped()}}],
                    return_document=AFTER) is not None:
                self._log_schedule(doc["queue"], doc["_id"], ScheduleEvent.INACTIVE,
                                   SCHEDULE_GONE)
                gone.append(doc["_id"])
        return gone

    def _bumped(self) -> Doc:
        return {"version": {"$add": ["$version", 1]}, "updated_at": now(self._off)}

    def _bumped_by_operator(self) -> Doc:
        """``_bumped`` for a trigger, pause or resume: an inactive record keeps its
        ``updated_at``, the moment it was retired, which ``_reactivated_cursor``'s grace
        reads (so an operator's action does not make a long-retired schedule fire its gap)."""
        active = {"$ifNull": ["$active", True]}
        return {"version": {"$add": ["$version", 1]},
                "updated_at": {"$cond": [active, now(self._off), "$updated_at"]}}

    def _log_schedule(self, queue: str, name: str, event: str, reason: str,
                      data: Mapping[str, Any] | None = None) -> None:
        self._log([Event(queue, schedule_journal_id(name), str(event),
                          {"reason": reason, "data": dict(data) if data else None})])


def _differs(doc: Doc, queue: str, spec_json: str) -> bool:
    return doc["spec"] != spec_json or doc["queue"] != queue or not doc["active"]


def _takes(doc: Doc, queues: Sequence[str]) -> bool:
    """Whether a registrar using ``queues`` may change the record: an active one of another
    queue is another app's."""
    return not doc["active"] or doc["queue"] in queues


def _intent_job(tick: datetime, spec: JobSpec) -> Doc:
    return {"tick": tick, "id": spec.job_id, "task": spec.task, "payload": spec.payload_json,
            "max_attempts": spec.max_attempts, "priority": spec.priority}


def _spec(job: Mapping[str, Any]) -> JobSpec:
    return JobSpec(job["id"], json.loads(job["payload"]), job["payload"], task=job["task"],
                   max_attempts=job["max_attempts"], priority=int(job.get("priority") or 0))


def _state(doc: Mapping[str, Any]) -> ScheduleState:
    intent = doc.get("intent") or {}
    return ScheduleState(
        name=doc["_id"], queue=doc["queue"], spec_json=doc["spec"],
        # a date: register writes the cursor and advance only moves it
        cursor=records.dt(doc["cursor"]), version=int(doc["version"]),  # type: ignore[arg-type]
        last_tick=records.dt(doc.get("last_tick")), last_job_id=doc.get("last_job_id"),
        skipped=int(doc.get("skipped") or 0), paused=bool(doc.get("paused")),
        active=bool(doc.get("active", True)), updated_at=records.dt(doc.get("updated_at")),
        # a date: _intent_job writes each job's tick
        intent=tuple((records.dt(j["tick"]), _spec(j))  # type: ignore[misc]
                     for j in intent.get("jobs", ())))
