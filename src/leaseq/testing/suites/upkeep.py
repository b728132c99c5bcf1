"""Upkeep, inspection, operator actions and the server clock."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from leaseq.errors import InvalidInput, JobNotFound, StoreNotFound
from leaseq.job import LeaseLost
from leaseq.stores import connect
from leaseq.stores.base import PURGE_BATCH
from leaseq.testing.harness import (
    CLOCK_SLACK_S,
    LONG_LEASE_S,
    W1,
    FreshStore,
    advance,
    events,
    given_claimed,
    given_jobs,
    must_get,
    run_processes,
    shifted_clock,
    within_readings,
)
from leaseq.validate import redact_url

HOUR_S = 3600.0


def _write_older_data(store: Any, queue: str, job_id: str, attempts: int) -> None:
    """Set a pending job's attempts behind the API's back: what leaseq before the revision
    reset could leave (a new revision that lowered max_attempts below the attempts kept). No
    primitive can write it any more, so each store is reached by its own means."""
    kind = type(store).__name__
    if kind == "SQLiteStore":
        with store._tx() as conn:
            conn.execute("UPDATE leaseq_jobs SET attempts = ? WHERE queue = ? AND id = ?",
                         (attempts, queue, job_id))
    elif kind == "PostgresStore":
        store._session.run(lambda conn: conn.execute(
            f"UPDATE {store._schema}.jobs SET attempts = %s WHERE queue = %s AND id = %s",
            (attempts, queue, job_id)))
    elif kind == "MongoStore":
        store._coll(queue).update_one({"_id": job_id}, {"$set": {"attempts": attempts}})
    else:
        pytest.skip(f"skipped: the suite cannot write older data into a {kind}")


class UpkeepSuite:
    def test_sweep_quarantines_a_pending_job_whose_attempts_are_spent(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given older data: a pending job with attempts 3 of 2 (never claimable), and a
        # healthy pending job
        q = leaseq_store.queue(max_attempts=2)
        q.enqueue("stuck", {})
        q.enqueue("fine", {})
        _write_older_data(leaseq_store.store, q.name, "stuck", 3)
        assert q.ready() == 1
        # When the sweeper reclaims
        assert q.reclaim_expired() == (1, 0)
        # Then the stuck job is quarantined as exhausted, and journaled; the other untouched
        stuck = must_get(q, "stuck")
        assert (stuck.status, stuck.failure, stuck.attempts) == ("failed", "exhausted", 3)
        assert "attempts spent while pending" in (stuck.error or "")
        assert events(q.journal("stuck"))[-1] == "quarantined"
        assert must_get(q, "fine").status == "pending"
        assert q.reclaim_expired() == (0, 0)
        # And an operator can run it again
        assert q.requeue("stuck") is True
        assert [j.id for j in q.claim(W1, 2)] == ["fine", "stuck"]


    def test_purge_deletes_only_named_statuses_old_enough(self, leaseq_store: FreshStore) -> None:
        # Given done / failed / app-status jobs finished 100 s ago, and a done one just now
        q = leaseq_store.queue()
        q.complete(given_claimed(q, "done-old"))
        q.fail(given_claimed(q, "failed-old"), "bad")
        q.complete(given_claimed(q, "skipped-old"), status="skipped_too_large")
        q.enqueue("pending-old", {})
        advance(leaseq_store.store, 100)
        q.complete(given_claimed(q, "done-new"))
        # When done and failed older than 50 s are purged
        assert q.purge(done=50, failed=50) == 2
        # Then exactly those are gone, with their journal
        assert q.get("done-old") is None and q.get("failed-old") is None
        assert q.journal("done-old") == [] and q.journal("failed-old") == []
        remaining = {j.id for j in q.list_jobs()}
        assert remaining == {"skipped-old", "pending-old", "done-new"}
        assert q.journal("done-new") != []
        assert q.purge(done=50, failed=50) == 0

    def test_purge_of_more_jobs_than_one_batch_deletes_them_all(
            self, leaseq_store: FreshStore) -> None:
        # Given two batches' worth of old done jobs and a few more (a first retention over a
        # big table), and one kept by its age
        q = leaseq_store.queue()
        total = 2 * PURGE_BATCH + 5
        ids = given_jobs(q, total)
        while jobs := q.claim(W1, limit=500):
            q.complete_many(jobs)
        advance(leaseq_store.store, 100)
        q.complete(given_claimed(q, "done-new"))
        # When they are purged, batch after batch
        assert q.purge(done=50) == total
        # Then every one is gone with its journal, and the young one stays
        assert q.counts() == {"done": 1}
        assert q.journal(ids[0]) == [] and q.journal(ids[-1]) == []
        assert q.purge(done=50) == 0

    def test_purge_refuses_live_statuses(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        q.enqueue("j1", {})
        advance(leaseq_store.store, 100)
        with pytest.raises(InvalidInput):
            q.purge(pending=1)
        assert q.counts() == {"pending": 1}

    def test_migrate_is_idempotent_and_keeps_jobs(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        q.enqueue("j1", {"a": 1})
        version = leaseq_store.store.migrate()
        assert version >= 1
        assert leaseq_store.store.migrate() == version
        assert must_get(q, "j1").payload == {"a": 1}

    def test_migrate_is_safe_to_race(self, leaseq_store: FreshStore) -> None:
        versions: list[int] = []

        def open_and_migrate() -> None:
            store = leaseq_store.open()
            try:
                versions.append(store.migrate())
            finally:
                store.close()

        threads = [threading.Thread(target=open_and_migrate) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert versions == [leaseq_store.store.migrate()] * 4


class InspectionSuite:
    def test_counts_ready_and_oldest_pending_age(self, leaseq_store: FreshStore) -> None:
        # Given: ready, delayed, held, expiring and done jobs
        q = leaseq_store.queue()
        start = leaseq_store.store.server_now()
        q.enqueue("ready", {})
        q.enqueue("delayed", {}, delay_s=1000)
        given_claimed(q, "held", lease_s=LONG_LEASE_S)
        given_claimed(q, "expiring", lease_s=10)
        q.complete(given_claimed(q, "done"))
        # When 30 s pass (the expiring lease ran out 20 s ago)
        advance(leaseq_store.store, 30)
        # Then the ready count holds the ready and the expired job, not the delayed one
        assert q.counts() == {"pending": 2, "processing": 2, "done": 1}
        assert q.ready() == 2
        # (the oldest, "ready", waited the 30 s and however long the calls since took)
        age = q.oldest_pending_age_s()
        upto = (leaseq_store.store.server_now() - start).total_seconds()
        assert within_readings(30, upto, shortest=age, longest=age), (age, upto)

    def test_in_flight_counts_processing_jobs_with_a_live_lease(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given ready, held, expiring and done jobs
        q = leaseq_store.queue()
        assert q.in_flight() == 0
        q.enqueue("ready", {})
        given_claimed(q, "held", lease_s=LONG_LEASE_S)
        given_claimed(q, "expiring", lease_s=10)
        q.complete(given_claimed(q, "done"))
        assert q.in_flight() == 2
        # When the expiring lease runs out, Then only the held job is in flight: the expired
        # one is ready work again, not running work
        advance(leaseq_store.store, 30)
        assert (q.in_flight(), q.ready()) == (1, 2)
        assert leaseq_store.queue("other").in_flight() == 0

    def test_expired_lease_is_ready_since_it_ran_out(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        start = leaseq_store.store.server_now()
        given_claimed(q, "expiring", lease_s=10)
        assert (q.ready(), q.oldest_pending_age_s()) == (0, 0.0)
        advance(leaseq_store.store, 25)
        assert q.ready() == 1
        # ready since its lease ran out: 15 s, and however long the calls since the claim took
        age = q.oldest_pending_age_s()
        upto = (leaseq_store.store.server_now() - start).total_seconds() - 10
        assert within_readings(15, upto, shortest=age, longest=age), (age, upto)

    def test_empty_and_only_delayed_queues(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        assert (q.counts(), q.ready(), q.oldest_pending_age_s()) == ({}, 0, 0.0)
        q.enqueue("later", {}, delay_s=60)
        assert (q.counts(), q.ready(), q.oldest_pending_age_s()) == ({"pending": 1}, 0, 0.0)

    def test_get_and_list_with_paging(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        ids = [f"job-{i:02d}" for i in range(25)]
        q.enqueue_many([q.spec(job_id, {"i": i}) for i, job_id in reversed(list(enumerate(ids)))])
        job = q.claim_one("job-07", W1)
        assert job is not None
        q.complete(job)
        assert q.get("missing") is None
        pages, after = [], None
        while page := q.list_jobs(limit=10, after_id=after):
            pages.append([j.id for j in page])
            after = page[-1].id
        assert pages == [ids[:10], ids[10:20], ids[20:]]
        assert [j.id for j in q.list_jobs(status="done")] == ["job-07"]
        assert len(q.list_jobs(status="pending", limit=100)) == 24

    def test_queues_lists_queues_with_jobs(self, leaseq_store: FreshStore) -> None:
        assert leaseq_store.store.queues() == []
        leaseq_store.queue("beta").enqueue("j1", {})
        leaseq_store.queue("alpha").enqueue("j1", {})
        assert leaseq_store.store.queues() == ["alpha", "beta"]


    def test_schema_version_reads_what_migrate_returned(self, leaseq_store: FreshStore) -> None:
        # Given a migrated store holding a job
        store = leaseq_store.store
        leaseq_store.queue().enqueue("j1", {})
        version = store.migrate()
        # When the version is read twice, Then it is migrate's, and reading it wrote nothing
        assert store.schema_version() == version
        assert store.schema_version() == version
        assert leaseq_store.queue().counts() == {"pending": 1}

    def test_schema_version_is_none_where_no_schema_was_made(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a store whose schema was dropped
        store = leaseq_store.store
        try:
            store.drop()
        except NotImplementedError:
            pytest.skip("skipped: the store cannot drop its schema (drop is for tests)")
        # When its version is read, Then there is none, and reading made none
        assert store.schema_version() is None
        assert store.schema_version() is None

    def test_create_false_opens_an_existing_store(self, leaseq_store: FreshStore) -> None:
        # Given a store holding a job
        if not leaseq_store.store.supports_create_false:
            pytest.skip("skipped: the store does not take create=False")
        leaseq_store.queue().enqueue("j1", {"a": 1})
        # When it is opened again with create=False, Then it reads what is there
        with connect(leaseq_store.url, create=False, **leaseq_store.options) as reader:
            assert reader.counts("jobs") == {"pending": 1}
            assert reader.schema_version() == leaseq_store.store.schema_version()

    def test_create_false_makes_nothing_where_no_schema_is(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given a database whose leaseq schema was dropped (a URL a typo points elsewhere)
        store = leaseq_store.store
        if not store.supports_create_false:
            pytest.skip("skipped: the store does not take create=False")
        try:
            store.drop()
        except NotImplementedError:
            pytest.skip("skipped: the store cannot drop its schema (drop is for tests)")
        # When it is opened with create=False, Then it is not found, and nothing was made
        with pytest.raises(StoreNotFound, match="leaseq migrate") as refused:
            connect(leaseq_store.url, create=False, **leaseq_store.options)
        # (the store names itself: a store registered under a scheme of its own may give
        # its inner store's URL; either way with any password masked)
        assert refused.value.url == redact_url(refused.value.url)
        assert store.schema_version() is None


class OperatorSuite:
    @pytest.mark.parametrize("end", ["failed", "cancelled", "done"])
    def test_operator_requeue_makes_a_terminal_job_ready(
        self, leaseq_store: FreshStore, end: str
    ) -> None:
        q = leaseq_store.queue(max_attempts=1)
        job = given_claimed(q)
        if end == "failed":
            q.fail(job, "bad")
        elif end == "cancelled":
            q.cancel(job.id)
        else:
            q.complete(job)
        assert q.requeue(job.id) is True
        back = must_get(q, job.id)
        assert (back.status, back.attempts, back.failure) == ("pending", 0, None)
        assert [j.id for j in q.claim(W1)] == [job.id]
        assert "requeued" in events(q.journal(job.id))

    def test_operator_requeue_gives_a_fresh_snooze_budget(self, leaseq_store: FreshStore) -> None:
        # Given a job quarantined by the snooze bound
        q = leaseq_store.queue(max_snoozes=1)
        q.enqueue("j1", {})
        q.snooze(q.claim(W1)[0], 0)
        assert q.snooze(q.claim(W1)[0], 0).status == "failed"
        # When an operator requeues it, Then it may snooze again
        assert q.requeue("j1") is True
        assert (must_get(q, "j1").snoozes, must_get(q, "j1").givebacks) == (0, 0)
        assert q.snooze(q.claim(W1)[0], 0).status == "pending"

    def test_operator_requeue_of_a_live_or_missing_job(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        q.enqueue("pending", {})
        given_claimed(q, "processing")
        assert q.requeue("pending") is False
        assert q.requeue("processing") is False
        with pytest.raises(JobNotFound):
            q.requeue("missing")

    def test_cancel_of_a_processing_job_fences_its_worker_out(
        self, leaseq_store: FreshStore
    ) -> None:
        q = leaseq_store.queue()
        job = given_claimed(q)
        assert q.cancel(job.id) is True
        assert q.heartbeat([job]) == [job.id]
        with pytest.raises(LeaseLost):
            q.complete(job)
        assert must_get(q, job.id).status == "cancelled"
        assert q.claim(W1) == []
        assert "cancelled" in events(q.journal(job.id))

    def test_cancel_by_status(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        q.enqueue("pending", {})
        q.fail(given_claimed(q, "failed"), "bad")
        q.complete(given_claimed(q, "done"))
        assert (q.cancel("pending"), q.cancel("failed"), q.cancel("done")) == (True, True, False)
        assert q.cancel("pending") is False  # already cancelled
        assert q.counts() == {"cancelled": 2, "done": 1}
        with pytest.raises(JobNotFound):
            q.cancel("missing")


def _faked_clock_worker(url: str, options: dict[str, Any], offset_s: float) -> list[str]:
    """A worker process whose Python clock is off by ``offset_s``: enqueue one, claim one."""
    real = time.time()
    with shifted_clock(offset_s):
        _assert_shifted(real, offset_s)
        store = connect(url, **options)
        try:
            q = store.queue("clock", lease_s=60)
            q.enqueue("delayed", {}, delay_s=100)
            return [j.id for j in q.claim(W1)]
        finally:
            store.close()


def _assert_shifted(real: float, offset_s: float) -> None:
    """The fake is in force: otherwise the clock tests would prove nothing."""
    assert abs(time.time() - real - offset_s) < 60
    assert abs(datetime.now(UTC).timestamp() - real - offset_s) < 60


class ClockSuite:
    def test_server_now_is_utc_and_follows_time_offset(self, leaseq_store: FreshStore) -> None:
        store = leaseq_store.store
        now = store.server_now()
        offset = now.utcoffset()
        assert offset is not None and offset.total_seconds() == 0
        advance(store, HOUR_S)
        ahead = (store.server_now() - now).total_seconds()
        assert HOUR_S <= ahead <= HOUR_S + 60

    @pytest.mark.parametrize("offset_s", [HOUR_S, -HOUR_S], ids=["plus-1h", "minus-1h"])
    def test_python_clock_changes_no_lease_or_not_before(
        self, leaseq_store: FreshStore, offset_s: float
    ) -> None:
        q = leaseq_store.queue("clock", lease_s=60)
        q.enqueue("ready", {})
        before, real = leaseq_store.store.server_now(), time.time()
        with shifted_clock(offset_s):
            _assert_shifted(real, offset_s)
            q.enqueue("delayed", {}, delay_s=100)
            (job,) = q.claim(W1)
        after = leaseq_store.store.server_now()
        _assert_from_store_clock(q, job.id, before, after)

    @pytest.mark.parametrize("offset_s", [HOUR_S, -HOUR_S], ids=["plus-1h", "minus-1h"])
    def test_worker_process_with_faked_clock_changes_nothing(
        self, leaseq_store: FreshStore, offset_s: float
    ) -> None:
        q = leaseq_store.queue("clock")
        q.enqueue("ready", {})
        before = leaseq_store.store.server_now()
        (taken,) = run_processes(_faked_clock_worker,
                                 [(leaseq_store.url, dict(leaseq_store.options), offset_s)])
        after = leaseq_store.store.server_now()
        assert taken == ["ready"]
        _assert_from_store_clock(q, "ready", before, after)


def _assert_from_store_clock(q: Any, claimed_id: str, before: Any, after: Any) -> None:
    """The lease (60 s) and the not-before (100 s) were set from the store's clock, read
    before and after: a clock an hour off would put them far outside."""
    lease = must_get(q, claimed_id).lease_until - before
    assert lease.total_seconds() >= 60 - CLOCK_SLACK_S
    assert (must_get(q, claimed_id).lease_until - after).total_seconds() <= 60 + CLOCK_SLACK_S
    not_before = must_get(q, "delayed").lease_until
    assert (not_before - before).total_seconds() >= 100 - CLOCK_SLACK_S
    assert (not_before - after).total_seconds() <= 100 + CLOCK_SLACK_S
