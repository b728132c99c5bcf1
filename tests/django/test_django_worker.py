"""The django-tasks backend's round trip and the leaseq tasks through a real worker process
(``manage.py leaseq_worker --burst`` on the same test database), and ``run_jobs`` running
enqueued jobs inside a ``TestCase``'s transaction."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.core.management import CommandError, call_command
from django.test import TestCase
from django.utils import timezone
from django_tasks import TaskResult, TaskResultStatus, task_backends
from django_tasks.exceptions import TaskResultDoesNotExist
from django_tasks.signals import task_enqueued, task_finished, task_started
from djangotest_app import jobs
from djangotest_helpers import aliases, worker_env

from leaseq.contrib.django import worker as django_worker
from leaseq.contrib.django.tasks import register_runners
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


@pytest.mark.django_db(transaction=True)
def test_the_worker_command_does_not_wait_for_a_handler_past_the_grace_period(
        tmp_path: Path) -> None:
    # Given a worker process whose sync handler blocks far longer than the grace period
    marker = tmp_path / "started"
    jobs.hang.enqueue(str(marker), 600, job_id="h")
    command = [sys.executable, "-m", "django", "leaseq_worker", "--queue", "hang",
               "--grace-s", "0.2"]
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        process = subprocess.Popen(command, env=worker_env(), stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert process.poll() is None and time.monotonic() < deadline, "never started"
            time.sleep(0.05)
        # When it is asked to stop
        process.terminate()  # SIGTERM
        # Then it exits once the grace period is over, its job given back, the handler
        # stopped with the process instead of finishing later
        assert process.wait(30) == 0, log.read_text()[-2000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
    job = jobs.app.queue("hang").get("h")
    assert job is not None and (job.status, job.givebacks) == ("pending", 1)
    assert not Path(f"{marker}.end").exists()


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
def test_async_jobs_get_fresh_connections_on_a_thread_of_their_own(monkeypatch) -> None:
    from django.db import connections

    # Given two async jobs on Django's async ORM; the first (higher priority: it runs first)
    # closes its connection under Django, as a database restart would
    closed: list[tuple[int, str]] = []
    real = connections.close_all

    def counted() -> None:
        closed.append((time.monotonic_ns(), threading.current_thread().name))
        real()

    monkeypatch.setattr(connections, "close_all", counted)
    jobs.orm_probe.enqueue(True, job_id="broke", priority=1)
    jobs.orm_probe.enqueue(job_id="next")
    # When a Django worker runs them one at a time (one claim per job: no prefetch)
    django_worker.run(jobs.app, WorkerConfig(queues=("orm",), burst=True, concurrency=1,
                                             prefetch=0), threading.Event())
    # Then both read through the ORM: the broken connection was not handed to "next"
    queue = jobs.app.queue("orm")
    broke, following = queue.get("broke"), queue.get("next")
    assert broke is not None and following is not None
    assert (broke.status, following.status) == ("done", "done"), following.error
    assert following.result["count"] == broke.result["count"] > 0
    # And each job's ORM calls ran on a thread of its own, whose connections were closed
    # when the job ended
    assert broke.result["thread"] != following.result["thread"]
    assert [name for _, name in closed] == [broke.result["thread"], following.result["thread"]]
    after_1, after_2 = (at for at, _ in closed)
    assert broke.result["at"] < after_1 < following.result["at"] < after_2


@pytest.mark.django_db(transaction=True)
def test_an_async_jobs_clean_up_leaves_another_async_jobs_connection_open(
        monkeypatch) -> None:
    from django.contrib.contenttypes.models import ContentType
    from django.db.backends.base.base import BaseDatabaseWrapper

    # Given rows to read one chunk at a time, and two async jobs: one iterates over them and,
    # after its first chunk, waits until the other has ended and a connection was closed
    for n in range(3):
        ContentType.objects.create(app_label="interleave", model=f"m{n}")
    rows = ContentType.objects.count()
    turns = {name: threading.Event()
             for name in ("iterating", "quick_returned", "other_job_cleaned_up")}
    monkeypatch.setattr(jobs, "turns", turns)
    real_close = BaseDatabaseWrapper.close

    def close(wrapper: BaseDatabaseWrapper) -> None:
        real_close(wrapper)
        if turns["quick_returned"].is_set():
            turns["other_job_cleaned_up"].set()

    monkeypatch.setattr(BaseDatabaseWrapper, "close", close)
    iterating = jobs.iterate_across_another_job.enqueue(priority=1).job_id
    quick = jobs.quick_count.enqueue().job_id
    # When a Django worker runs both at once (Django's default CONN_MAX_AGE: 0)
    django_worker.run(jobs.app, WorkerConfig(queues=("interleave",), burst=True,
                                             concurrency=2), threading.Event())
    # Then the other job's clean-up closed no connection under the iteration: it read all
    queue = jobs.app.queue("interleave")
    job = queue.get(iterating)
    assert (job.status, job.result) == ("done", rows), job.error  # type: ignore[union-attr]
    assert turns["other_job_cleaned_up"].is_set()
    assert queue.get(quick).status == "done"  # type: ignore[union-attr]


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

    def test_a_return_value_json_cannot_hold_fails_the_task_for_good(self) -> None:
        # Given a task whose return value JSON cannot hold, and a receiver of task_finished
        finished: list[str] = []

        def receive(sender: object, task_result: TaskResult, **kwargs: object) -> None:
            finished.append(task_result.status)

        task_finished.connect(receive)
        self.addCleanup(task_finished.disconnect, receive)
        enqueued = jobs.returns_a_datetime.enqueue()
        # When it runs
        [ran] = run_jobs(queues=["default"])
        # Then it failed for good, as in Django's own backends (no retry runs its body again)
        self.assertEqual((ran.status, ran.failure), ("failed", "permanent"), ran.error)
        result = jobs.returns_a_datetime.get_result(enqueued.id)
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertIs(result.errors[0].exception_class, TypeError)
        self.assertEqual(finished, [TaskResultStatus.FAILED])

    def test_a_task_runs_and_reads_back_as_using_made_it(self) -> None:
        # Given a task declared on another backend, enqueued through leaseq's with using()
        run_after = timezone.now() - timedelta(minutes=1)
        enqueued = jobs.reports_its_task.using(backend="default", queue_name="other",
                                               run_after=run_after).enqueue()
        # When it runs
        [ran] = run_jobs(queues=["other"])
        # Then it ran as enqueued (on leaseq's backend, from the queue using() chose), and
        # its result reads back so
        made = {"backend": "default", "queue_name": "other", "run_after": run_after.isoformat()}
        self.assertEqual((ran.status, ran.result), ("done", made), ran.error)
        result = task_backends["default"].get_result(enqueued.id)
        task = result.task
        self.assertEqual((task.backend, task.queue_name, task.run_after),
                         ("default", "other", run_after))

    def test_a_job_enqueued_by_an_older_leaseq_runs_as_its_task_is_declared(self) -> None:
        # Given a job of a Django task whose payload has no "using" (an older leaseq's)
        register_runners(jobs.app, ["default"])  # as the backend's first use does
        payload = {"path": "djangotest_app.jobs.add", "args": [2, 3], "kwargs": {}}
        jobs.app.queue("default").enqueue("older", payload, task="django_tasks:default")
        # When it runs
        [ran] = run_jobs(queues=["default"])
        # Then it ran, and reads back, as its task is declared
        self.assertEqual((ran.status, ran.result), ("done", 5), ran.error)
        result = jobs.add.get_result("older")
        self.assertEqual((result.task.backend, result.task.queue_name), ("default", "default"))

    def test_a_task_enqueued_as_declared_saves_no_using(self) -> None:
        # So a worker of an older leaseq (whose handler takes no "using") runs it too
        plain = jobs.add.enqueue(1, 2)
        made = jobs.add.using(queue_name="other").enqueue(1, 2)
        self.assertNotIn("using", jobs.app.queue("default").get(plain.id).payload)  # type: ignore[union-attr]
        saved = jobs.app.queue("other").get(made.id).payload["using"]  # type: ignore[union-attr]
        self.assertEqual(saved["queue_name"], "other")

    def test_every_failure_names_an_exception_class_that_imports(self) -> None:
        # Given Django tasks that failed: in the task, outside it (the runner names the
        # exception's class only: here, attempts spent on an import that failed), and with a
        # reason of leaseq's own (its lease ran out)
        jobs.explode.enqueue()
        run_jobs(queues=["default"])
        queue = jobs.app.queue("default")
        payload = {"path": "djangotest_app.jobs.add", "args": [], "kwargs": {}}
        outside: dict[str, BaseException | str] = {
            "unimportable": ModuleNotFoundError("No module named 'gone'"),
            "expired": "lease expired 3 times"}
        for job_id, error in outside.items():
            queue.enqueue(job_id, payload, task="django_tasks:default")
            queue.fail(queue.claim("w1")[0], error, "exhausted")
        # When their results are read
        failed = [job.id for job in queue.list_jobs("failed")]
        backend = task_backends["default"]
        classes = {job_id: [e.exception_class for e in backend.get_result(job_id).errors]
                   for job_id in failed}
        # Then each error names a class that imports
        self.assertEqual(len(classes), 3)
        self.assertEqual(classes.pop("unimportable"), [ModuleNotFoundError])
        self.assertEqual(classes.pop("expired"), [Exception])
        self.assertEqual(list(classes.values()), [[KeyError]])

    def test_an_id_that_cannot_name_a_job_is_a_result_that_does_not_exist(self) -> None:
        # Given ids no job can have (empty, over 512 bytes, with a NUL) and one no job has
        backend = task_backends["default"]
        for result_id in ("", "x" * 513, "a\x00b", "nonexistent"):
            with self.subTest(result_id=result_id[:10]):
                # When a result is asked for by one, through the backend or the task, in
                # blocking or async code
                # Then it does not exist, as Django's own backends say (a view maps it to 404)
                with self.assertRaises(TaskResultDoesNotExist):
                    backend.get_result(result_id)
                with self.assertRaises(TaskResultDoesNotExist):
                    jobs.add.get_result(result_id)
                with self.assertRaises(TaskResultDoesNotExist):
                    async_to_sync(backend.aget_result)(result_id)
                with self.assertRaises(TaskResultDoesNotExist):
                    async_to_sync(jobs.add.aget_result)(result_id)

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


@pytest.mark.django_db
@pytest.mark.parametrize(("option", "value", "says"), [
    ("--concurrency", "0", "concurrency must be 1 to 10000, got 0"),
    ("--grace-s", "-1", "grace_s must be a number of seconds from 0"),
    ("--grace-s", "nan", "got nan")])
def test_the_worker_command_refuses_an_option_out_of_range_as_a_usage_error(
        option: str, value: str, says: str) -> None:
    # Given an option the worker's config refuses
    # When the worker command is called with it
    with pytest.raises(CommandError) as refused:
        call_command("leaseq_worker", "--burst", option, value)
    # Then it is a usage error naming the option, as `leaseq worker` says it (exit 2)
    assert str(refused.value).startswith(f"Invalid value for '{option}': ")
    assert says in str(refused.value)
    assert refused.value.returncode == 2


@pytest.mark.django_db(transaction=True)
def test_the_worker_command_out_of_range_prints_one_line_and_exits_2() -> None:
    # Given a worker command run from the command line with --concurrency 0
    done = subprocess.run(
        [sys.executable, "-m", "django", "leaseq_worker", "--burst", "--concurrency", "0"],
        env=worker_env(), capture_output=True, text=True, timeout=120)
    # Then it exits 2 with Django's one line for a CommandError, no traceback
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().endswith(
        "CommandError: Invalid value for '--concurrency': concurrency must be 1 to 10000, "
        "got 0"), done.stderr[-2000:]


def test_an_empty_queues_list_is_refused() -> None:
    from django.core.exceptions import ImproperlyConfigured

    from leaseq.contrib.django.tasks import LeaseqBackend

    # Given Django's "QUEUES": [] (any queue name), which no worker could serve
    # When a leaseq backend is configured so
    # Then it says to list the queues, rather than serving "default" alone
    with pytest.raises(ImproperlyConfigured, match="list them"):
        LeaseqBackend("tasks", {"QUEUES": []})
