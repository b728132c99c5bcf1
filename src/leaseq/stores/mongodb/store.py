"""MongoDB store: one collection per queue, every write one atomic single-document statement.

Atomicity without transactions: each primitive changes each job with one
``find_one_and_update`` / ``update_many`` whose filter carries the whole guard (claimable,
fenced, still expired), so two workers can never both win. Transactions (replica set or mongos)
are used where several documents must change together: ``enqueue_many``, ``complete(then=…)``,
and each job's change with its journal entries (workers.py). Without transactions the journal
follows the change; docs/mongodb.md says what happens when that write fails.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from bson import ObjectId
from pymongo import ReadPreference, ReturnDocument, UpdateOne
from pymongo.client_session import ClientSession
from pymongo.errors import DuplicateKeyError, OperationFailure

from leaseq import validate
from leaseq.errors import (
    InvalidInput,
    InvalidQueueName,
    InvalidURL,
    JobConflict,
    UnsupportedOperation,
)
from leaseq.job import (
    EnqueueOutcome,
    EnqueueResult,
    Job,
    JobSpec,
    JournalEntry,
    Lease,
    OnConflict,
)
from leaseq.journal import EXPIRED, OPERATOR, SPENT_WHILE_PENDING, JournalEvent
from leaseq.limits import FrontFirst
from leaseq.stores.base import PURGE_BATCH, Store, require_schema
from leaseq.stores.mongodb import documents, indexes, records, upserts
from leaseq.stores.mongodb.aio import AsyncMongo, AsyncOpener
from leaseq.stores.mongodb.connection import (
    MAX_DOCUMENT_BYTES,
    async_opener,
    check_ttl_status,
    guarded,
    no_transactions_message,
    open_client,
    opening_bound,
    secrets_of,
)
from leaseq.stores.mongodb.ledger import ScheduleLedger
from leaseq.stores.mongodb.limited import LimitedClaims
from leaseq.stores.mongodb.operators import OperatorTools
from leaseq.stores.mongodb.records import Event
from leaseq.stores.mongodb.workers import WorkerWrites

AFTER, BEFORE = ReturnDocument.AFTER, ReturnDocument.BEFORE
SCHEMA_VERSION = 1
#: The collection of the queues' limits documents (limited.py), beside the journal's.
LIMITS = "limits"
#: Collection names the store keeps for itself, and what each holds.
_TAKEN = {"journal": "journal", LIMITS: "claim limits of every queue"}
#: Index option conflicts: an equivalent index already exists under another name or options
#: (an adopted collection's own TTL index, say). The operator's index is kept.
_INDEX_EXISTS = (85, 86)
#: IndexOptionsConflict: the index exists with other options (or under another name).
_INDEX_OPTIONS_CONFLICT = 85
_INDEX_NOT_FOUND = 27

log = logging.getLogger(__name__)
_OUTCOMES = {upserts.CREATE: EnqueueOutcome.CREATED, upserts.KEEP: EnqueueOutcome.UNCHANGED,
             upserts.REVIVE: EnqueueOutcome.REVIVED, upserts.UPDATE: EnqueueOutcome.UPDATED,
             upserts.STALE: EnqueueOutcome.UPDATED, "conflict": EnqueueOutcome.CONFLICT}
#: The outcomes that wrote the job, and so journal ``enqueued``.
_WRITTEN = (EnqueueOutcome.CREATED, EnqueueOutcome.UPDATED, EnqueueOutcome.REVIVED)


class MongoStore(WorkerWrites, LimitedClaims, ScheduleLedger, OperatorTools, Store):
    """Open with ``leaseq.connect("mongodb://host/db?prefix=leaseq_&ttl=tombstone:2592000")``.

    With ``create=False`` the store makes no collection and no index, and drops none (a
    reader's URL without ``ttl=`` must not take the workers' TTL indexes away); ``migrate``
    makes it a store that does."""

    supports_create_false = True
    max_value_bytes = MAX_DOCUMENT_BYTES  # a job is one document, payload and result in it

    def __init__(self, database: Any, *, url: str = "mongodb://", prefix: str = "leaseq_",
                 ttl_s: Mapping[str, float] | None = None, time_offset_s: float = 0.0,
                 client: Any = None, async_database: AsyncOpener | None = None,
                 create: bool = True):
        self.url = validate.redact_url(url)
        self.secrets = secrets_of(url)  # masked in every error text
        self.time_offset_s = time_offset_s
        self._db = database
        self._client: Any = client if client is not None else getattr(database, "client", None)
        self._owns_client = client is not None
        self._prefix = prefix
        #: None: no ``ttl=`` given, leaseq's TTL indexes are left as they are (see _coll)
        self._ttl_s = (None if ttl_s is None
                       else {check_ttl_status(s): float(v) for s, v in ttl_s.items()})
        self._collections: dict[str, Any] = {}  # those whose indexes this store has made
        self._journal = self._primary(self._prefix + "journal")
        self._limits = self._primary(self._prefix + LIMITS)  # limited.py
        self._front_first = FrontFirst()  # limited.py
        #: Native async reads when an opener is given (``from_url`` gives one).
        self._async = AsyncMongo(self, async_database) if async_database else None
        with opening_bound(self._client):
            self.supports_transactions = self._probe_transactions()
        self.supports_claim_limits = self.supports_transactions  # limited.py needs them
        self._indexes_on_use = create  # _coll, operators.py's _workers
        if create:
            self.migrate()
        else:
            require_schema(self.url, self.schema_version(), SCHEMA_VERSION)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MongoStore:
        unknown = set(options) - {"prefix", "ttl_s", "time_offset_s", "create"}
        if unknown:
            raise InvalidURL(f"unknown MongoDB store option(s) {', '.join(sorted(unknown))}; "
                             "known: prefix, ttl_s, time_offset_s, create")
        parsed, client = open_client(url)
        options.setdefault("prefix", parsed.prefix)
        options.setdefault("ttl_s", parsed.ttl_s)
        try:
            return cls(client[parsed.database], url=url, client=client,
                       async_database=async_opener(parsed), **options)
        except BaseException:
            client.close()
            raise

    # --- plumbing ---------------------------------------------------------------------------

    @guarded
    def _probe_transactions(self) -> bool:
        hello = self._db.command("hello")
        return "setName" in hello or hello.get("msg") == "isdbgrid"

    def _name(self, queue: str) -> str:
        if queue in _TAKEN:
            raise InvalidQueueName(f"queue name {queue!r} is taken on MongoDB: "
                                   f"{self._prefix}{queue} holds the {_TAKEN[queue]}")
        return self._prefix + queue

    def _coll(self, queue: str) -> Any:
        """The queue's collection; its indexes are made on first use (outside any session)."""
        name = self._name(queue)
        coll = self._collections.get(name)
        if coll is None:
            coll = self._primary(name)
            if self._indexes_on_use:
                self._create_indexes(coll, documents.job_indexes(self._ttl_s or {}))
                if self._ttl_s is not None:
                    self._drop_unconfigured_ttl(coll)
            self._collections[name] = coll
        return coll

    def _primary(self, name: str) -> Any:
        """Read from the primary whatever the URL's ``readPreference`` says: the store's reads
        decide its writes (a claim's candidates, what a reclaim moved), and a lagging
        secondary would offer jobs already taken."""
        return self._db[name].with_options(read_preference=ReadPreference.PRIMARY)

    def _create_indexes(self, coll: Any, specs: Sequence[tuple[Any, dict[str, Any]]]) -> None:
        for keys, options in specs:
            try:
                coll.create_index(keys, **options)
            except OperationFailure as exc:
                if exc.code == _INDEX_OPTIONS_CONFLICT and "expireAfterSeconds" in options:
                    self._set_ttl(coll, options["name"], options["expireAfterSeconds"])
                elif exc.code not in _INDEX_EXISTS:
                    raise

    def _set_ttl(self, coll: Any, name: str, seconds: int) -> None:
        """Our TTL index of a status exists with another lifetime (``ttl=`` changed): it
        takes the one configured now. One of another name (an adopted collection's) is kept
        as it is."""
        try:
            self._db.command("collMod", coll.name,
                             index={"name": name, "expireAfterSeconds": seconds})
        except OperationFailure as exc:
            if exc.code != _INDEX_NOT_FOUND:
                _ttl_not_changed(coll.name, name, f"its lifetime stays as it was ({exc.code})")

    def _drop_unconfigured_ttl(self, coll: Any) -> None:
        """A status taken out of ``ttl=`` must stop expiring: its ``leaseq_ttl_<status>``
        index (leaseq's own, by its name) is dropped. Other indexes are never touched; only
        a store given ``ttl=`` (``ttl_s``) calls this."""
        configured = {f"{indexes.TTL_INDEX_PREFIX}{status}" for status in self._ttl_s or {}}
        for index in coll.list_indexes():
            name = index.get("name", "")
            if name.startswith(indexes.TTL_INDEX_PREFIX) and name not in configured:
                try:
                    coll.drop_index(name)
                except OperationFailure as exc:  # not found: another process dropped it
                    if exc.code != _INDEX_NOT_FOUND:
                        _ttl_not_changed(coll.name, name, f"not dropped ({exc.code})")

    def _log(self, events: Sequence[Event], session: Any = None) -> None:
        """Append journal entries, stamped by the server clock, in one round trip."""
        if not events:
            return
        ops = [UpdateOne({"_id": ObjectId()}, documents.journal_entry(
                   e.queue, e.job_id, e.event, e.fields, self._off), upsert=True)
               for e in events]
        self._journal.bulk_write(ops, ordered=True, session=session)

    def _transaction(self, work: Callable[[Any], Any]) -> Any:
        if not self.supports_transactions:
            return work(None)
        with self._client.start_session() as session:
            # Reads in a transaction take the transaction's read preference, not their
            # collection's: one a URL sets (secondaryPreferred, say) would refuse them all
            return session.with_transaction(work, read_preference=ReadPreference.PRIMARY)

    # --- set-up -----------------------------------------------------------------------------

    @guarded
    def migrate(self) -> int:
        if not self._indexes_on_use:  # create=False, now asked to make the schema after all
            self._indexes_on_use = True
            self._collections.clear()  # the collections it opened unindexed get indexed
        self._create_indexes(self._journal, documents.journal_indexes())
        for queue in self.queues():
            self._coll(queue)
        return SCHEMA_VERSION

    @guarded
    def schema_version(self) -> int | None:
        # migrate() records no version on MongoDB (the version is this code's): what it leaves
        # is the journal collection with its indexes, so the schema exists once that does.
        journal = self._prefix + "journal"
        if journal not in self._db.list_collection_names(filter={"name": journal}):
            return None
        return SCHEMA_VERSION

    @guarded
    def server_now(self) -> Any:
        local = records.dt(self._db.command("hello")["localTime"])
        # not None: hello always answers localTime, a date
        return local + timedelta(seconds=self._off)  # type: ignore[operator]

    @guarded
    def queues(self) -> list[str]:
        found = []
        for name in self._db.list_collection_names(
                filter={"name": {"$regex": "^" + re.escape(self._prefix)}}):
            queue = name[len(self._prefix):]
            if queue in _TAKEN or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", queue):
                continue
            if self._db[name].find_one({}, {"_id": 1}) is not None:
                found.append(queue)
        return sorted(found)

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    @guarded
    def drop(self) -> None:
        for name in self._db.list_collection_names(
                filter={"name": {"$regex": "^" + re.escape(self._prefix)}}):
            self._db.drop_collection(name)
        self._collections.clear()

    # --- producers -------------------------------------------------------------------------

    @guarded
    def enqueue_many(self, queue: str, specs: Sequence[JobSpec], on_conflict: OnConflict = "raise",
                     connection: Any = None) -> list[EnqueueResult]:
        self._coll(queue)  # indexes first: createIndexes may not run inside a transaction
        upserts.refuse_wide_integers(specs)
        if connection is not None:
            self._check_session(connection)
            if on_conflict == "raise":  # the caller may catch JobConflict and commit
                self._refuse_conflicts(queue, specs, connection)
            return self._enqueue(connection, queue, specs, on_conflict)
        if not self.supports_transactions and on_conflict == "raise":
            self._refuse_conflicts(queue, specs)
        return self._transaction(lambda s: self._enqueue(s, queue, specs, on_conflict))

    def _check_session(self, session: Any) -> None:
        if not isinstance(session, ClientSession):
            raise TypeError("connection= must be a pymongo ClientSession on the MongoDB store")
        if not self.supports_transactions:
            raise UnsupportedOperation(no_transactions_message(self.url))
        if not session.in_transaction:
            raise InvalidInput("connection= must be a session inside a transaction: call "
                               "session.start_transaction() (or with_transaction) first")

    def _enqueue(self, session: Any, queue: str, specs: Sequence[JobSpec],
                 on_conflict: OnConflict) -> list[EnqueueResult]:
        results, events, conflicts = [], [], []
        for spec in specs:
            outcome = self._upsert(self._coll(queue), spec, on_conflict, session)
            results.append(EnqueueResult(spec.job_id, outcome))
            if outcome is EnqueueOutcome.CONFLICT and on_conflict == "raise":
                conflicts.append(spec.job_id)
            elif outcome in _WRITTEN:
                data = {"revision": spec.revision} if spec.revision else None
                events.append(Event(queue, spec.job_id, JournalEvent.ENQUEUED,
                               {"reason": outcome.value, "data": data}))
        self._log(events, session)
        if conflicts:  # in a transaction this aborts it; see _refuse_conflicts otherwise
            raise JobConflict(queue, conflicts)
        return results

    def _upsert(self, coll: Any, spec: JobSpec, on_conflict: str, session: Any) -> EnqueueOutcome:
        payload = json.loads(spec.payload_json)  # canonical key order, the same on every replay
        pipeline = upserts.upsert(payload, spec.task, spec.revision, spec.max_attempts,
                                  spec.delay_s, on_conflict, self._off, spec.priority,
                                  spec.concurrency_key)
        for tries_left in (1, 0):
            try:
                before = coll.find_one_and_update({"_id": spec.job_id}, pipeline, upsert=True,
                                                  return_document=BEFORE, session=session)
                break
            except DuplicateKeyError:  # a concurrent upsert inserted the same new id first
                if not tries_left:
                    raise
        return _OUTCOMES[upserts.upsert_outcome(before, payload, spec.revision, on_conflict)]

    def _refuse_conflicts(self, queue: str, specs: Sequence[JobSpec],
                          session: Any = None) -> None:
        """``raise`` finds its conflicts before the first write where nothing would undo
        that write: without transactions, and in a caller's transaction (``session``), which
        the caller may commit after catching ``JobConflict``.

        In a caller's transaction the read is in its snapshot, so a producer that changes one
        of the jobs afterwards makes our write a write conflict, not a silent overwrite.
        Without transactions a producer racing in between can still make a conflict appear
        later; the pipeline never writes one, but the jobs of the batch written before it
        stay written.
        """
        ids = list({spec.job_id for spec in specs})
        stored = self._coll(queue).find({"_id": {"$in": ids}}, session=session)
        conflicts = upserts.batch_conflicts({d["_id"]: d for d in stored}, specs)
        if conflicts:
            raise JobConflict(queue, conflicts)

    # --- upkeep ----------------------------------------------------------------------------

    @guarded
    def reclaim_expired(self, queue: str) -> tuple[int, int]:
        """Three steps in this order (DESIGN.md §3): bury the expired spent jobs before any
        can become pending; return the other expired ones; then quarantine any pending job
        whose attempts are spent (older data), which no claim would ever take."""
        spent = self._move(queue, documents.expired(self._off, spent_=True),
                           documents.expire_spent(self._off),
                           lambda d: Event(queue, d["_id"], JournalEvent.QUARANTINED,
                                           records.moved(d, EXPIRED)))
        returned = self._move(queue, documents.expired(self._off, spent_=False),
                              documents.return_expired(self._off),
                              lambda d: Event(queue, d["_id"], JournalEvent.RECLAIMED,
                                              records.moved(d, records.reclaim_reason(d))))
        exhausted = self._move(queue, documents.pending_spent(),
                               documents.exhaust_pending(self._off),
                               lambda d: Event(queue, d["_id"], JournalEvent.QUARANTINED,
                                               records.moved(d, SPENT_WHILE_PENDING)))
        return len(spent) + len(exhausted), len(returned)

    def _move(self, queue: str, query: dict[str, Any], update: list[dict[str, Any]],
              entry: Callable[[dict[str, Any]], Event]) -> list[dict[str, Any]]:
        """``update_many`` the documents ``query`` finds, ``PURGE_BATCH`` at a time, and
        journal each chunk's moves (``entry``) before the next is read; returns the ones it
        moved. A failure part-way leaves every chunk moved so far journalled, and no command
        carries more than ``PURGE_BATCH`` ids (a backlog's ``$in`` would pass 16 MB). Stops
        after a short chunk. No chunk is read twice: each update takes the documents it
        matched out of ``query``, and a racer took out the ones it did not match."""
        moved: list[dict[str, Any]] = []
        while True:
            found = list(self._coll(queue).find(query, documents.FENCE_PROJECTION,
                                                limit=PURGE_BATCH))
            chunk = self._move_chunk(queue, query, update, found)
            self._log([entry(d) for d in chunk])
            moved += chunk
            if len(found) < PURGE_BATCH:
                return moved

    def _move_chunk(self, queue: str, query: dict[str, Any], update: list[dict[str, Any]],
                    found: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Those of ``found`` one ``update_many`` moved.

        The update repeats the whole filter, so a document that changed after the read is
        skipped, and stamps each document it changes with a token of this call
        (``moved_by``); when the count says some were skipped, a second read by that token
        keeps only those this call moved, not those another sweeper, a worker's give-back or
        retry moved the same way in between (at the same epoch).
        """
        if not found:
            return []
        coll, ids, token = self._coll(queue), [d["_id"] for d in found], ObjectId()
        moved = coll.update_many({**query, "_id": {"$in": ids}}, documents.stamped(update, token))
        if moved.matched_count == len(found):
            return found
        mine = {d["_id"] for d in coll.find(documents.stamped_by(ids, token), {"_id": 1})}
        return [d for d in found if d["_id"] in mine]

    @guarded
    def purge(self, queue: str, older_than_s: Mapping[str, float]) -> int:
        coll, deleted = self._coll(queue), 0
        for status, age in older_than_s.items():
            query = documents.purgeable(status, age, self._off)
            while ids := [d["_id"] for d in coll.find(query, {"_id": 1}, limit=PURGE_BATCH)]:
                gone = self._transaction(functools.partial(self._purge_batch, queue, query, ids))
                deleted += gone
                if not gone:
                    break
        return deleted

    def _purge_batch(self, queue: str, query: dict[str, Any], ids: list[str],
                     session: Any) -> int:
        """Delete the jobs of ``ids`` still ``query`` finds, then the journal of those gone
        (not of one that went live in between), in one transaction where the deployment has
        them, as the SQL stores do: neither a job without its story nor the reverse."""
        coll = self._coll(queue)
        gone = int(coll.delete_many({**query, "_id": {"$in": ids}}, session=session)
                   .deleted_count)
        left = {d["_id"] for d in coll.find({"_id": {"$in": ids}}, {"_id": 1}, session=session)}
        self._journal.delete_many({"queue": queue,
                                   "job_id": {"$in": [i for i in ids if i not in left]}},
                                  session=session)
        return gone

    # --- operators -------------------------------------------------------------------------

    @guarded
    def requeue(self, queue: str, job_id: str) -> bool:
        return self._operator(queue, job_id, documents.operator_requeueable(job_id),
                              documents.operator_requeue(self._off), JournalEvent.REQUEUED)

    @guarded
    def cancel(self, queue: str, job_id: str) -> bool:
        return self._operator(queue, job_id, documents.cancellable(job_id),
                              documents.operator_cancel(self._off), JournalEvent.CANCELLED)

    def _operator(self, queue: str, job_id: str, query: dict[str, Any],
                  update: list[dict[str, Any]], event: str) -> bool:
        doc = self._change_logged(queue, query, update, lambda d: [Event(
            queue, job_id, event, {"attempt": d.get("attempts", 0),
                                   "lease_epoch": d.get("lease_epoch", 0), "reason": OPERATOR})])
        return self._changed_or_missing(queue, job_id, doc)

    # --- broker outbox --------------------------------------------------------------------

    @guarded
    def outbox_due(self, queue: str, limit: int) -> list[Job]:
        cursor = self._coll(queue).find(documents.outbox_due(self._off),
                                        sort=documents.OUTBOX_SORT, limit=limit)
        return [records.job(queue, d) for d in cursor]

    @guarded
    def republish(self, queue: str, published_before_s: float) -> int:
        query = documents.published_before(published_before_s, self._off)
        return self._coll(queue).update_many(query, documents.unpublish()).modified_count

    @guarded
    def mark_published(self, queue: str, leases: Sequence[Lease],
                       as_of: datetime | None = None) -> list[str]:
        pairs = [(lease.job_id, lease.lease_epoch) for lease in leases]
        marked = self._move(queue, documents.unpublished(pairs, self._off, as_of),
                            documents.mark_published(self._off),
                            lambda d: Event(queue, d["_id"], JournalEvent.PUBLISHED,
                                            records.moved(d, None)))
        return [d["_id"] for d in marked]

    # --- inspection ------------------------------------------------------------------------

    @guarded
    def get(self, queue: str, job_id: str) -> Job | None:
        doc = self._coll(queue).find_one({"_id": job_id})
        return None if doc is None else records.job(queue, doc)

    @guarded
    def list_jobs(self, queue: str, status: str | None = None, limit: int = 100,
                  after_id: str | None = None) -> list[Job]:
        cursor = self._coll(queue).find(documents.listing(status, after_id),
                                        sort=documents.ID_SORT, limit=limit)
        return [records.job(queue, d) for d in cursor]

    @guarded
    def counts(self, queue: str) -> dict[str, int]:
        return {r["_id"]: r["n"] for r in self._coll(queue).aggregate(documents.counts())}

    def _ready(self, queue: str) -> dict[str, Any]:
        rows = list(self._coll(queue).aggregate(documents.ready(self._off)))
        return rows[0] if rows else {"n": 0, "age_ms": None}

    @guarded
    def ready_stats(self, queue: str) -> tuple[int, float]:
        stats = self._ready(queue)
        return int(stats["n"]), records.ready_age_s(stats)

    @guarded
    def in_flight(self, queue: str) -> int:
        """Processing jobs whose lease is live: work being done now (0 when none)."""
        return self._coll(queue).count_documents(documents.in_flight(self._off))

    @guarded
    def journal(self, queue: str, job_id: str) -> list[JournalEntry]:
        cursor = self._journal.find(documents.journal_of(queue, job_id),
                                    sort=documents.JOURNAL_SORT)
        return [records.entry(d) for d in cursor]

    @guarded
    def append_journal(self, queue: str, job_id: str, event: str, *,
                       attempt: int | None = None, lease_epoch: int | None = None,
                       worker_id: str | None = None, reason: str | None = None,
                       data: Mapping[str, Any] | None = None) -> None:
        self._log([Event(queue, job_id, event, {
            "attempt": attempt, "lease_epoch": lease_epoch, "worker_id": worker_id,
            "reason": reason, "data": dict(data) if data else None})])

    # --- broker outbox: a message dead-lettered unsettled ---------------------------------

    @guarded
    def reowe_publish(self, queue: str, job_ids: Sequence[str],
                      reason: str = Store.REOWE_REASON) -> list[str]:
        if not job_ids:
            return []
        owed = self._move(queue, documents.published(job_ids), documents.unpublish(),
                          lambda d: Event(queue, d["_id"], JournalEvent.PUBLISH_OWED,
                                          records.moved(d, reason)))
        return [d["_id"] for d in owed]

    # --- asyncio callers (stores/mongodb/aio.py) --------------------------------------------

    async def aget(self, queue: str, job_id: str) -> Job | None:
        if self._async is None:
            return await super().aget(queue, job_id)
        return await self._async.get(queue, job_id)

    async def acounts(self, queue: str) -> dict[str, int]:
        if self._async is None:
            return await super().acounts(queue)
        return await self._async.counts(queue)

    async def ajournal(self, queue: str, job_id: str) -> list[JournalEntry]:
        if self._async is None:
            return await super().ajournal(queue, job_id)
        return await self._async.journal(queue, job_id)

    async def aclose(self) -> None:
        if self._async is not None:
            await self._async.close()


def _ttl_not_changed(collection: str, index: str, what: str) -> None:
    """A ``ttl=`` change the server refused (the user may create indexes but not change or
    drop them): the queue goes on, and the log says what to do."""
    log.warning("MongoDB collection %s: TTL index %s %s; change it by hand (collMod or "
                "dropIndexes) or grant the role those actions", collection, index, what)

