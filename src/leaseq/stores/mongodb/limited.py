"""The MongoDB store's limited claim (docs/limits.md): priorities, per-key concurrency and
the sliding-window rate, enforced inside one transaction per claim.

How: the claim's first write is to the queue's document in ``{prefix}limits`` (a counter, the
server clock). Two limited claims of one queue that overlap both write it, so MongoDB aborts
one of them with a write conflict and ``with_transaction`` runs it again; a claim therefore
reads (in its transaction's snapshot) every claim committed before it, and none commits in
between. The counts it reads (processing jobs per key, the rate log) stay true until it
commits; a finish committed meanwhile only makes them too high, never too low.

What it costs: one transaction per claim instead of one per job, the limits document written
on every claim (all of a queue's limited claims take turns on it, retried on conflict). A
key-limited claim reads the queue's front first (``_front_ids``: one ``find`` of its first
``window_size`` claimable jobs, one ``aggregate`` of their keys' running jobs), which decides
the claim whenever the limits let enough of it run; otherwise it walks the keys: the keys of
pending jobs (``documents.pending_keys``, a ``$group`` on the key after an equality on
``status``, which ``KEYED_INDEX`` can answer with one seek per key, as the SQL stores' walk
seeks), the running counts read from the processing jobs (as many as run at once, whatever
the backlog), and each key's first claimable jobs up to its free slots. Without
transactions (a standalone server) the limits cannot be enforced: ``claim`` raises
``UnsupportedOperation``.

Mixed into ``MongoStore`` (see store.py), after ``WorkerWrites``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from pymongo import ReturnDocument

from leaseq.errors import UnsupportedOperation
from leaseq.job import Job
from leaseq.journal import JournalEvent
from leaseq.limits import (
    UNKEYED_SCAN,
    ClaimLimits,
    FrontFirst,
    HeldBack,
    admit,
    free_slots,
    held_back,
    key_backlog,
    on_clock,
    record,
    stamp,
    window_size,
)
from leaseq.stores.mongodb import documents, records
from leaseq.stores.mongodb.connection import guarded
from leaseq.stores.mongodb.records import Event

AFTER = ReturnDocument.AFTER
#: What a limited claim reads of a candidate: enough to put candidates in claim order and
#: tell the key each would run with (``run_key``).
CANDIDATE = {"_id": 1, "priority": 1, "lease_until": 1, "concurrency_key": 1, "stale": 1,
             "next_concurrency_key": 1}
_EARLIEST = datetime.min.replace(tzinfo=UTC)


class LimitedClaims:
    """``claim`` and ``claim_one`` under ``ClaimLimits``, and ``held_back``."""

    supports_transactions: bool
    _off: float
    _coll: Callable[[str], Any]
    _limits: Any
    _log: Callable[..., None]
    _transaction: Callable[[Callable[[Any], Any]], Any]
    _ready: Callable[[str], dict[str, Any]]
    _db: Any
    _front_first: FrontFirst

    #: Limits need transactions: set with ``supports_transactions`` (store.py).
    supports_claim_limits: bool

    def _claim_limited(self, queue: str, worker_id: str, limit: int, lease_s: float,
                       limits: ClaimLimits, job_id: str | None = None) -> list[Job]:
        if not self.supports_transactions:
            raise UnsupportedOperation(
                f"queue {queue!r}: key_limit and rate_per_s need MongoDB transactions (a "
                "replica set or mongos); this server is standalone")
        update = documents.claim(worker_id, lease_s, self._off, documents.new_claim_token())
        coll = self._coll(queue)

        def work(session: Any) -> list[Job]:
            recent, at = self._open_gate(queue, limits, session)
            room = limit if limits.rate_per_s is None else admit(
                recent, at, limit, limits.rate_per_s)
            ids = self._limited_ids(coll, room, limits, job_id, session) if room else []
            jobs = []
            for found_id in ids:
                doc = coll.find_one_and_update(documents.claimable_id(found_id, self._off), update,
                                               return_document=AFTER, session=session)
                if doc is not None:
                    jobs.append(records.job(queue, doc))
            self._log([Event(queue, j.id, JournalEvent.CLAIMED, records.claimed_fields(j))
                       for j in jobs], session)
            if limits.rate_per_s is not None and jobs:
                self._limits.find_one_and_update(
                    {"_id": queue},
                    {"$set": {"recent": record(recent, at, len(jobs), limits.rate_per_s)}},
                    session=session)
            return jobs

        return self._transaction(work)

    def _open_gate(self, queue: str, limits: ClaimLimits,
                   session: Any) -> tuple[list[float], float]:
        """Write the queue's limits document (see the module's docstring): its rate log and
        the stamp of this claim."""
        update = documents.limits_claim(limits.key_limit, limits.rate_per_s, self._off)
        gate = self._limits.find_one_and_update({"_id": queue}, update, upsert=True,
                                                return_document=AFTER, session=session)
        now = _seconds(gate.get("now"))
        recent = on_clock([float(t) for t in gate.get("recent") or []], now)
        return recent, stamp(recent, now)

    def _limited_ids(self, coll: Any, room: int, limits: ClaimLimits, job_id: str | None,
                     session: Any) -> list[str]:
        """Ids to claim, in claim order."""
        if job_id is not None:
            return [job_id] if self._key_has_room(coll, job_id, limits, session) else []
        claimable, order = documents.claimable(self._off), documents.CLAIM_SORT
        if limits.key_limit is None:
            return [d["_id"] for d in coll.find(claimable, {"_id": 1}, sort=order, limit=room,
                                                session=session)]
        if self._front_first.worth_reading(coll.name):
            chosen = self._front_ids(coll, room, limits.key_limit, session)
            if chosen is not None:
                return chosen
        found = [d for d in coll.find(claimable, CANDIDATE, sort=order,
                                      limit=room + UNKEYED_SCAN, session=session)
                 if run_key(d) is None][:room]
        pending = {k["_id"] for k in coll.aggregate(documents.pending_keys(), session=session)}
        counts = {c["_id"]: c for c in coll.aggregate(
            documents.key_counts(self._off, processing_only=True), session=session)}
        # The keys with pending jobs, and those with a processing job whose lease ran out
        for key in sorted(pending | {key for key, c in counts.items() if c["ready"]}):
            running = counts[key]["running"] if key in counts else 0
            free = min(free_slots(limits.key_limit, running), room)
            if free:  # a lapsed job moving to another key is not this key's (run_key)
                found += [d for d in coll.find(documents.claimable_keyed(key, self._off),
                                               CANDIDATE, sort=order, limit=free,
                                               session=session) if run_key(d) == key]
        found.sort(key=_claim_order)
        return [d["_id"] for d in found[:room]]

    def _front_ids(self, coll: Any, room: int, key_limit: int, session: Any) -> list[str] | None:
        """The ids the queue's front decides to claim (``first_within_key_limits``): its
        first ``window_size(room)`` claimable jobs and the running counts of their keys. None
        when keys at their limit fill it (the key walk decides then; ``FrontFirst`` told)."""
        size = window_size(room)
        front = list(coll.find(documents.claimable(self._off), CANDIDATE,
                               sort=documents.CLAIM_SORT, limit=size, session=session))
        # A key that is not a string (an adopted collection's) is left out, as the key walk
        # leaves it out; the window still read it, so it counts against the window's size.
        window = [(d["_id"], run_key(d)) for d in front
                  if run_key(d) is None or isinstance(run_key(d), str)]
        keys = sorted({key for _, key in window if key is not None})
        running = {r["_id"]: int(r["running"]) for r in coll.aggregate(
            documents.keys_running(keys), session=session)} if keys else {}
        return self._front_first.decide(coll.name, window, running, room, key_limit,
                                        size - (len(front) - len(window)))

    def _key_has_room(self, coll: Any, job_id: str, limits: ClaimLimits, session: Any) -> bool:
        if limits.key_limit is None:
            return True
        doc = coll.find_one({"_id": job_id}, CANDIDATE, session=session)
        key = None if doc is None else run_key(doc)
        if not isinstance(key, str):
            return True
        running = coll.count_documents(
            {"status": documents.PROCESSING, "concurrency_key": key, "$and": [documents.HAS_KEY]},
            session=session)
        return running < limits.key_limit

    @guarded
    def held_back(self, queue: str, limits: ClaimLimits | None = None) -> HeldBack:
        coll = self._coll(queue)
        gate = self._limits.find_one({"_id": queue}) or {}
        if limits is None:
            limits = ClaimLimits(gate.get("key_limit"), gate.get("rate_per_s"))
        if not limits.any:
            return HeldBack()
        ready = int(self._ready(queue)["n"])
        by_key = 0
        if limits.key_limit is not None:
            by_key = key_backlog([(int(r["ready"]), int(r["running"]))
                                  for r in coll.aggregate(documents.key_counts(
                                      self._off, lapsed_free=True))],
                                 limits.key_limit)
        return held_back(ready, by_key, limits)

    @guarded
    def forget_limits(self, queue: str) -> None:
        self._limits.update_many(  # one document: its _id is the queue's name
            {"_id": queue, "$or": [{"key_limit": {"$ne": None}}, {"rate_per_s": {"$ne": None}}]},
            {"$set": {"key_limit": None, "rate_per_s": None}})

    @guarded
    def limited_queues(self) -> dict[str, ClaimLimits]:
        # One small document per queue that ran a limited claim: read them all, no index.
        found = {d["_id"]: ClaimLimits(d.get("key_limit"), d.get("rate_per_s"))
                 for d in self._limits.find({}, {"key_limit": 1, "rate_per_s": 1})}
        return {queue: limits for queue, limits in found.items() if limits.any}


def _seconds(value: Any) -> float:
    """Unix seconds of a BSON date (naive ones are UTC)."""
    when = records.dt(value)
    if when is None:
        raise ValueError("the limits document carries no server time")
    return when.timestamp()


def _claim_order(doc: dict[str, Any]) -> tuple[float, datetime, str]:
    """``CLAIM_SORT`` in Python: a missing priority sorts after every number, as in BSON."""
    priority = doc.get("priority")
    rank = -float(priority) if isinstance(priority, int | float) else float("inf")
    return rank, records.dt(doc.get("lease_until")) or _EARLIEST, doc["_id"]


def run_key(doc: Mapping[str, Any]) -> Any:
    """The key a candidate runs with if claimed: a lapsed stale job's new revision's
    (``documents.key_after_revision``, which the claim writes), else its own."""
    if doc.get("stale") is True and "next_concurrency_key" in doc:
        return doc["next_concurrency_key"]
    return doc.get("concurrency_key")
