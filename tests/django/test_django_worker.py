"""The django-tasks backend's round trip and the leaseq tasks through a real worker process
(``manage.py leaseq_worker --burst`` on the same test database), and ``run_jobs`` running
enqueued jobs inside a ``TestCase``'s transaction."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.test import TestCase
from django_tasks import TaskResultStatus
from djangotest_app import jobs
from djangotest_helpers import worker_env

from leaseq.contrib.django.testing import run_jobs


def _run_worker_burst() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "django", "leaseq_worker", "--burst", "--concurrency", "2",
         "--grace-s", "5"], env=worker_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.django_db(transaction=True)
def test_django_tasks_backend_round_trip_through_a_worker_process() -> None:
    # Given two Django tasks enqueued through the leaseq backend
    ok = jobs.add.enqueue(2, 3)
    bad = jobs.explode.enqueue()
    assert ok.status == TaskResultStatus.READY
    # When a worker process runs them
    _run_worker_burst()
    # Then the results come back through the backend
    ok.refresh()
    assert ok.status == TaskResultStatus.SUCCESSFUL and ok.return_value == 5
    bad.refresh()
    assert bad.status == TaskResultStatus.FAILED
    assert bad.errors[0].exception_class_path == "builtins.KeyError"
    assert jobs.add.get_result(ok.id).return_value == 5


@pytest.mark.django_db(transaction=True)
def test_leaseq_tasks_run_in_a_worker_process_with_fresh_connections() -> None:
    jobs.send_mail.enqueue("a@example.com", job_id="m1")
    _run_worker_burst()
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
