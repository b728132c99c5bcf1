"""The MongoDB store's claim and every fenced write after it (complete, retry_later, snooze,
give_back, fail, heartbeat), each one ``find_one_and_update`` whose filter carries the whole
guard, with its journal entries in the same transaction where the deployment has them.

Mixed into ``MongoStore``, whose plumbing (``_coll``, ``_log``, ``_transaction``,
``_enqueue``) it uses; see store.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from pymongo import ReturnDocument
from pymongo.errors import PyMongoError

from leaseq.job import Failure, FollowUp, Job, Lease, LeaseLost
from leaseq.journal import STALE_REASON, JournalEvent, quarantine_reason
from leaseq.limits import NO_LIMITS, ClaimLimits
from leaseq.stores.mongodb import documents, records, upserts
from leaseq.stores.mongodb.connection import OffsetClock, guarded
from leaseq.stores.mongodb.records import Event, JournalWriter

AFTER = ReturnDocument.AFTER
UNDONE_REASON = "claim undone: the store failed before the worker had the job"


class WorkerWrites(OffsetClock):
    """The worker-side primitives of the store protocol (see ``leaseq.stores.base``)."""

    supports_transactions: bool
    _coll: Callable[[str], Any]
    _log: JournalWriter
    _journal: Any
    _transaction: Callable[[Callable[[Any], Any]], Any]
    _enqueue: Callable[..., Any]
    _claim_limited: Callable[..., list[Job]]

    @guarded
    def claim(self, queue: str, worker_id: str, limit: int, lease_s: float,
              limits: ClaimLimits = NO_LIMITS) -> list[Job]:
        """One indexed read of the first ``limit`` claimable ids in claim order, then one
        claim per id by ``_id`` (each re-checks the whole claimable filter, so two workers
        never both win). Ids another worker took in between are skipped; when it took all
        of them the read is repeated, so an answer of ``[]`` always means none was claimable.
        Under ``limits``: ``LimitedClaims.claim_limited``."""
        if limits.any:
            return self._claim_limited(queue, worker_id, limit, lease_s, limits)
        coll = self._coll(queue)
        jobs: list[Job] = []
        while len(jobs) < limit:
            ids = [d["_id"] for d in coll.find(documents.claimable(self._off), {"_id": 1},
                                               sort=documents.CLAIM_SORT, limit=limit - len(jobs))]
            if not ids:
                break
            taken = self._claim_ids(queue, ids, worker_id, lease_s)
            jobs += taken
            if taken:
                break
        return jobs

    @guarded
    def claim_one(self, queue: str, job_id: str, worker_id: str, lease_s: float,
                  limits: ClaimLimits = NO_LIMITS) -> Job | None:
        if limits.any:
            taken = self._claim_limited(queue, worker_id, 1, lease_s, limits, job_id)
            return taken[0] if taken else None
        self._coll(queue)
        taken = self._claim_ids(queue, [job_id], worker_id, lease_s)
        return taken[0] if taken else None

    def _claim_ids(self, queue: str, ids: Sequence[str], worker_id: str,
                   lease_s: float) -> list[Job]:
        """Claim these ids if still claimable, each with its ``claimed`` journal entry.

        With transactions each claim and its entry commit together, one transaction per job
        (a batch in one transaction would abort whole on any one job's write conflict).
        Without, the entries follow the claims. Either way, when the store fails part-way
        the jobs already claimed are given back at once, free, before the error is raised:
        a claim the caller never saw must not hold its job until the lease runs out and
        cost it an attempt.
        """
        update = documents.claim(worker_id, lease_s, self._off, documents.new_claim_token())
        coll, jobs = self._coll(queue), []

        def one(job_id: str, session: Any) -> Job | None:
            doc = coll.find_one_and_update(documents.claimable_id(job_id, self._off), update,
                                           return_document=AFTER, session=session)
            return None if doc is None else records.job(queue, doc)

        def logged(job_id: str) -> Callable[[Any], Job | None]:
            def work(session: Any) -> Job | None:
                found = one(job_id, session)
                if found is not None:
                    self._log([_claimed(queue, found)], session)
                return found
            return work

        try:
            for job_id in ids:
                found = (self._transaction(logged(job_id)) if self.supports_transactions
                         else one(job_id, None))
                if found is not None:
                    jobs.append(found)
            if not self.supports_transactions:
                self._log([_claimed(queue, j) for j in jobs])
        except PyMongoError:
            self._undo_claims(queue, jobs)
            raise
        return jobs

    def _undo_claims(self, queue: str, jobs: Sequence[Job]) -> None:
        """Best effort: the store may be the reason the claim failed. A claim not undone
        waits out its lease and comes back through reclaim."""
        update = documents.give_back(False, 0, self._off)

        def journal(doc: dict[str, Any]) -> list[Event]:
            return [Event(queue, doc["_id"], JournalEvent.GIVEN_BACK, records.fields(
                doc, Lease(doc["_id"], doc.get("lease_epoch", 0)), UNDONE_REASON))]

        for found in jobs:
            with contextlib.suppress(PyMongoError, LeaseLost):
                self._fenced(queue, found.lease, update, journal)

    @guarded
    def heartbeat_many(self, queue: str, leases: Sequence[Lease], lease_s: float) -> list[str]:
        coll = self._coll(queue)
        done = coll.update_many(documents.held(leases), documents.extend(lease_s, self._off))
        if done.matched_count == len(set(leases)):
            return []  # every lease held: one round trip (a document matches one lease)
        # A lease not held at the update is never held again (the epoch only grows), so the
        # documents read now name exactly the lost ones.
        now = {d["_id"]: d for d in coll.find({"_id": {"$in": [x.job_id for x in leases]}},
                                              documents.FENCE_PROJECTION)}
        lost = [lease for lease in leases if not records.holds(now.get(lease.job_id), lease)]
        self._log([Event(queue, lease.job_id, JournalEvent.HEARTBEAT_LOST,
                         records.lost_fields(now[lease.job_id], lease))
                   for lease in self._untold(queue, lost) if lease.job_id in now])
        return [lease.job_id for lease in lost]

    def _untold(self, queue: str, lost: Sequence[Lease]) -> list[Lease]:
        """The lost leases not journaled ``heartbeat_lost`` yet, once each: as on the SQL
        stores, a lease beaten again after its loss (a write retried) adds no entry."""
        told = {(e["job_id"], e.get("lease_epoch")) for e in self._journal.find(
            documents.journals_of(queue, sorted({x.job_id for x in lost})),
            {"job_id": 1, "event": 1, "lease_epoch": 1})
                if e.get("event") == JournalEvent.HEARTBEAT_LOST}
        return list({(x.job_id, x.lease_epoch): x for x in lost
                     if (x.job_id, x.lease_epoch) not in told}.values())

    def _finish(self, queue: str, lease: Lease, update: list[dict[str, Any]],
                session: Any) -> tuple[dict[str, Any], bool]:
        """The fenced write, or the give-back a stale job gets instead: ``(document, stale)``.

        Two filters instead of a ``$cond`` on ``stale``: which one matched says which write
        happened. ``stale`` only turns true while processing and only a claim (a new epoch)
        clears it, so it cannot change between the two statements of the same epoch.
        """
        coll = self._coll(queue)
        doc = coll.find_one_and_update(
            documents.fenced(lease, stale=False), update,
            return_document=AFTER, session=session)
        if doc is not None:
            return doc, False
        doc = coll.find_one_and_update(
            documents.fenced(lease, stale=True),
            documents.stale_give_back(self._off), return_document=AFTER, session=session)
        if doc is None:
            raise LeaseLost(queue, lease.job_id, lease.lease_epoch)
        self._log([Event(queue, lease.job_id, JournalEvent.GIVEN_BACK,
                    records.fields(doc, lease, STALE_REASON))], session)
        return doc, True

    def _fenced(self, queue: str, lease: Lease, update: list[dict[str, Any]],
                journal: Callable[[dict[str, Any]], list[Event]]) -> Job:
        """A fenced change (a stale job given back instead) and its journal entries, in one
        transaction where the deployment has them; without, the entries follow the change,
        and if they fail the change stands and the error is raised (the job is not held:
        the caller's next fenced write says the lease is gone)."""
        def work(session: Any) -> Job:
            doc, stale = self._finish(queue, lease, update, session)
            if not stale:
                self._log(journal(doc), session)
            return records.job(queue, doc)

        self._coll(queue)  # indexes before any transaction
        return self._transaction(work)

    @guarded
    def complete(self, queue: str, lease: Lease, result_json: str | None, status: str = "done",
                 result_key: str | None = None, then: Sequence[FollowUp] = ()) -> Job:
        for follow in then:
            upserts.refuse_wide_integers(follow.specs)  # before the job is written done
            self._coll(follow.queue)  # indexes before the transaction

        def work(session: Any) -> Job:
            doc, stale = self._finish(queue, lease, documents.complete(
                status, result_json, result_key, self._off), session)
            if not stale:
                saved = records.fields(doc, lease, status)
                self._log([Event(queue, lease.job_id, JournalEvent.RESULT_SAVED, saved)], session)
                for follow in then:
                    self._enqueue(session, follow.queue, follow.specs, "keep")
            return records.job(queue, doc)

        self._coll(queue)
        return self._transaction(work)

    @guarded
    def retry_later(self, queue: str, lease: Lease, error: str, reason: str,
                    delay_s: float) -> Job:
        def journal(doc: dict[str, Any]) -> list[Event]:
            if doc["status"] == documents.FAILED:
                return [Event(queue, lease.job_id, JournalEvent.QUARANTINED,
                         records.fields(doc, lease, quarantine_reason(Failure.EXHAUSTED, reason)))]
            return [Event(queue, lease.job_id, JournalEvent.RETRY_SCHEDULED,
                     {**records.fields(doc, lease, reason), "data": {"delay_s": delay_s}})]

        update = documents.retry_later(error, delay_s, self._off)
        return self._fenced(queue, lease, update, journal)

    @guarded
    def snooze(self, queue: str, lease: Lease, delay_s: float, reason: str = "snoozed",
               max_snoozes: int = 200) -> Job:
        def journal(doc: dict[str, Any]) -> list[Event]:
            if doc["status"] == documents.FAILED:
                return [_quarantined(queue, doc, lease)]
            return [Event(queue, lease.job_id, JournalEvent.SNOOZED,
                     {**records.fields(doc, lease, reason), "data": {"delay_s": delay_s}})]

        update = documents.snooze(delay_s, max_snoozes, self._off)
        return self._fenced(queue, lease, update, journal)

    @guarded
    def give_back(self, queue: str, lease: Lease, started: bool, reason: str,
                  max_givebacks: int = 3) -> Job:
        def journal(doc: dict[str, Any]) -> list[Event]:
            if doc["status"] == documents.FAILED:
                return [_quarantined(queue, doc, lease)]
            return [Event(queue, lease.job_id, JournalEvent.GIVEN_BACK,
                     {**records.fields(doc, lease, reason), "data": {"started": started}})]

        update = documents.give_back(started, max_givebacks, self._off)
        return self._fenced(queue, lease, update, journal)

    @guarded
    def fail(self, queue: str, lease: Lease, error: str, reason: str, failure: str) -> Job:
        def journal(doc: dict[str, Any]) -> list[Event]:
            return [Event(queue, lease.job_id, JournalEvent.QUARANTINED,
                     records.fields(doc, lease, quarantine_reason(failure, reason)))]

        return self._fenced(queue, lease, documents.fail(error, failure, self._off), journal)


def _claimed(queue: str, found: Job) -> Event:
    return Event(queue, found.id, JournalEvent.CLAIMED, records.claimed_fields(found))


def _quarantined(queue: str, doc: dict[str, Any], lease: Lease) -> Event:
    return Event(queue, lease.job_id, JournalEvent.QUARANTINED,
            records.fields(doc, lease, quarantine_reason(Failure.EXHAUSTED, str(doc.get("error")))))
