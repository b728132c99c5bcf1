"""The django-tasks backend's round trip and the leaseq tasks through a real worker process
(``manage.py leaseq_worker --burst`` on the same test database), and ``run_jobs`` running
enqueued jobs inside a ``TestCase``'s transaction."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from django.test import TestCase
from django_tasks import TaskResult, TaskResultStatus
from django_tasks.signals import task_enqueued, task_finished, task_started
from djangotest_app import jobs
from djangotest_helpers import aliases, worker_env

from leaseq.contrib.django.testing import run_jobs
from leaseq.stores import connect
from leaseq.worker import WorkerConfig


@pytest.fixture(params=aliases())
def on_alias(request: pytest.FixtureRequest) -> Iterator[str]:
    """The tests' App (and so the django-tasks backend) on this alias's connection."""
    alias = request.param
    before = jobs.app.store
    jobs.app.use_store(connect(f"django://{alias}"))
    yield alias
    jobs.app.store.close()
    jobs.app.use_store(before)


def _run_worker_burst(alias: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "django", "leaseq_worker", "--burst", "--concurrency", "2",
         "--grace-s", "5"], env={**worker_env(), "LEASEQ_DJANGO_URL": f"django://{alias}"},
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.django_db(transaction=True, databases=aliases())
def test_django_tasks_backend_round_trip_through_a_worker_process(on_alias: str) -> None:
    # Given two Django tasks enqueued through the leaseq backend
    ok = jobs.add.enqueue(2, 3)
    bad = jobs.explode.enqueue()
    assert ok.status == TaskResultStatus.READY
    # When a worker process runs them
    _run_worker_burst(on_alias)
    # Then the results come back through the backend
    ok.refresh()
    assert ok.status == TaskResultStatus.SUCCESSFUL and ok.return_value == 5
    bad.refresh()
    assert bad.status == TaskResultStatus.FAILED
    assert bad.errors[0].exception_class_path == "builtins.KeyError"
    assert jobs.add.get_result(ok.id).return_value == 5


@pytest.mark.django_db(transaction=True, databases=aliases())
def test_leaseq_tasks_run_in_a_worker_process_with_fresh_connections(on_alias: str) -> None:
    jobs.send_mail.enqueue("a@example.com", job_id="m1")
    _run_worker_burst(on_alias)
    job = jobs.app.queue("mail").wait("m1", timeout_s=10)
    assert job.status == "done" and job.result == {"sent_to": "a@example.com"}


class RunJobsInsideATestCase(TestCase):
    def test_enqueued_jobs_run_synchronously_in_the_tests_transaction(self) -> None:
        jobs.send_mail.enqueue("a@example.com", job_id="t1")
        jobs.always_fails.enqueue("nope", job_id="t2")
        ran = run_jobs(queues=["mail"])
        by_id = {j.id: j for j in ran}
        self.assertEqual(by_id["t1"].status, "done")
        self.assertEqual(by_id["t1"].result, {"sent_to": "a@example.com"})
        self.assertEqual(by_id["t2"].status, "pending")  # a retry was scheduled
        self.assertIn("ValueError: nope", by_id["t2"].error)
        self.assertEqual(run_jobs(queues=["mail"]), [])  # the retry is not due yet

    def test_an_async_task_runs_and_sees_the_tests_transaction(self) -> None:
        jobs.count_jobs_async.enqueue("mail", job_id="a1")
        [ran] = run_jobs(queues=["mail"])
        self.assertEqual((ran.status, ran.result), ("done", 1))  # it saw its own job


@pytest.mark.django_db(transaction=True)
def test_the_django_worker_refreshes_connections_around_every_job(monkeypatch) -> None:
    import leaseq.contrib.django.worker as django_worker

    calls: list[str] = []
    real = django_worker.close_old_connections

    def counted() -> None:
        calls.append(threading.current_thread().name)
        real()

    monkeypatch.setattr(django_worker, "close_old_connections", counted)
    for n in range(3):
        jobs.send_mail.enqueue(f"{n}@example.com", job_id=f"c{n}")
    django_worker.run(jobs.app, WorkerConfig(queues=("mail",), burst=True, concurrency=1),
                      threading.Event())
    assert jobs.app.queue("mail").counts() == {"done": 3}
    assert len(calls) == 6  # before and after each job, on the job's thread
    assert "MainThread" not in calls


@pytest.mark.django_db(transaction=True)
def test_async_jobs_get_fresh_connections_on_the_thread_of_their_orm_queries(
        monkeypatch) -> None:
    import leaseq.contrib.django.worker as django_worker

    # Given two async jobs on Django's async ORM; the first (higher priority: it runs first)
    # closes its connection under Django, as a database restart would
    refreshed: list[tuple[int, str]] = []
    real = django_worker.close_old_connections

    def counted() -> None:
        refreshed.append((time.monotonic_ns(), threading.current_thread().name))
        real()

    monkeypatch.setattr(django_worker, "close_old_connections", counted)
    jobs.orm_probe.enqueue(True, job_id="broke", priority=1)
    jobs.orm_probe.enqueue(job_id="next")
    # When a Django worker runs them one at a time (one claim per job: no prefetch)
    django_worker.run(jobs.app, WorkerConfig(queues=("orm",), burst=True, concurrency=1,
                                             prefetch=0), threading.Event())
    # Then both read through the ORM: the broken connection was replaced before "next" ran
    queue = jobs.app.queue("orm")
    broke, following = queue.get("broke"), queue.get("next")
    assert (broke.status, following.status) == ("done", "done"), following.error
    assert following.result["count"] == broke.result["count"] > 0
    # And the connections were refreshed before and after each job, on its ORM thread
    orm_thread = broke.result["thread"]
    assert following.result["thread"] == orm_thread
    assert [name for _, name in refreshed] == [orm_thread] * 4
    before_1, after_1, before_2, after_2 = (at for at, _ in refreshed)
    assert before_1 < broke.result["at"] < after_1 <= before_2 < following.result["at"] < after_2


class DjangoTasksInsideATestCase(TestCase):
    def test_a_task_that_takes_context_gets_its_task_result(self) -> None:
        # Given a takes_context task enqueued through the leaseq backend
        enqueued = jobs.knows_its_context.enqueue("x")
        # When it runs
        [ran] = run_jobs(queues=["default"])
        # Then it was called with a TaskContext of its own result, on its first attempt
        self.assertEqual(ran.status, "done", ran.error)
        self.assertEqual(ran.result, {"tag": "x", "id": enqueued.id, "attempt": 1})

    def test_djangos_task_signals_are_sent_as_by_djangos_own_backends(self) -> None:
        # Given receivers of Django's task signals
        seen: list[tuple[str, str, str]] = []

        def receiver(signal_name: str):  # one receiver per signal, kept alive by the test
            def receive(sender: object, task_result: TaskResult, **kwargs: object) -> None:
                seen.append((signal_name, task_result.task.name, task_result.status))
            return receive

        receivers = {name: receiver(name) for name in ("enqueued", "started", "finished")}
        for name, signal in (("enqueued", task_enqueued), ("started", task_started),
                             ("finished", task_finished)):
            signal.connect(receivers[name])
            self.addCleanup(signal.disconnect, receivers[name])
        # When a task that succeeds and one that fails are enqueued and run
        jobs.add.enqueue(1, 2)
        jobs.explode.enqueue()
        run_jobs(queues=["default"])
        # Then each was enqueued, started and finished with its status
        S = TaskResultStatus
        self.assertCountEqual(seen, [
            ("enqueued", "add", S.READY), ("started", "add", S.RUNNING),
            ("finished", "add", S.SUCCESSFUL), ("enqueued", "explode", S.READY),
            ("started", "explode", S.RUNNING), ("finished", "explode", S.FAILED)])

    def test_started_at_is_the_claim_not_the_finish(self) -> None:
        # Given a task run to its end
        enqueued = jobs.add.enqueue(2, 2)
        run_jobs(queues=["default"])
        # When its result is read
        result = jobs.add.get_result(enqueued.id)
        # Then it started when it was claimed, by the worker that claimed it
        [claim] = [e for e in jobs.app.queue("default").journal(enqueued.id)
                   if e.event == "claimed"]
        self.assertEqual((result.started_at, result.last_attempted_at), (claim.at, claim.at))
        self.assertEqual(result.worker_ids, [claim.worker_id])
        # (the same tick when a no-op runs within the clock's resolution)
        self.assertLessEqual(result.started_at, result.finished_at)
