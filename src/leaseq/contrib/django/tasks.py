"""A backend for Django's task framework (the ``django_tasks`` backport on Django 5.2; the
same API as Django 6's ``django.tasks``). Tested with django-tasks 0.12 on Django 5.2::

    TASKS = {"default": {"BACKEND": "leaseq.contrib.django.tasks.LeaseqBackend",
                         "QUEUES": ["default"]}}

A Django task becomes a leaseq job on the queue of its ``queue_name``, run by
``manage.py leaseq_worker`` through one leaseq task per queue (``django_tasks:<queue>``)
registered on ``settings.LEASEQ_APP``'s App. The result id is the job id. Django's tasks have
no retries: an exception fails the task for good (``failed``, reason ``permanent``), as with
Django's own backends; ``run_after`` becomes the job's delay.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.module_loading import import_string
from django_tasks import DEFAULT_TASK_QUEUE_NAME, TaskResult, TaskResultStatus, task_backends
from django_tasks.backends.base import BaseTaskBackend
from django_tasks.base import Task, TaskError
from django_tasks.exceptions import TaskResultDoesNotExist

from leaseq.app import App
from leaseq.job import Job, JobStatus, Permanent

RUNNER_PREFIX = "django_tasks:"
_STATUSES: dict[str, Any] = {JobStatus.PENDING: TaskResultStatus.READY,
                              JobStatus.PROCESSING: TaskResultStatus.RUNNING,
                              JobStatus.DONE: TaskResultStatus.SUCCESSFUL}


def run_django_task(path: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The leaseq handler of every Django task: import the task and call it."""
    task: Task = import_string(path)
    try:
        return task.call(*args, **kwargs)
    except Exception as exc:
        kind = type(exc)
        raise Permanent(f"{kind.__module__}.{kind.__qualname__}: {exc}") from exc


def register_runners(app: App, queues: Iterable[str]) -> None:
    """Register the runner task for each queue on ``app`` (idempotent)."""
    for queue in queues:
        name = RUNNER_PREFIX + queue
        if name not in app.tasks:
            app.task(run_django_task, name=name, queue=queue)


def backend_queue_names(app: App) -> list[str]:
    """The queues of every configured ``LeaseqBackend``, their runners registered on
    ``app`` (what the worker command serves)."""
    names: list[str] = []
    for backend in task_backends.all():
        if isinstance(backend, LeaseqBackend):
            register_runners(app, backend.queues)
            names.extend(backend.queues)
    return names


class LeaseqBackend(BaseTaskBackend):
    supports_defer = True
    supports_get_result = True
    supports_async_task = False

    def __init__(self, alias: str, params: dict[str, Any]):
        super().__init__(alias, params)
        self.queues = self.queues or {DEFAULT_TASK_QUEUE_NAME}
        self._app: App | None = None

    @property
    def app(self) -> App:
        if self._app is None:
            from leaseq.contrib.django.settings import project_app

            app = project_app()
            register_runners(app, self.queues)
            self._app = app
        return self._app

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        job_id = uuid.uuid4().hex
        payload = {"path": task.module_path, "args": list(args), "kwargs": dict(kwargs)}
        self.app.enqueue(RUNNER_PREFIX + task.queue_name, payload, job_id=job_id,
                         delay_s=_delay_s(task.run_after))
        job = self.app.queue(task.queue_name).get(job_id)
        # not None: enqueued just above
        return self._result(task, job, job_id)  # type: ignore[arg-type]

    def get_result(self, result_id: str) -> TaskResult:
        for queue in sorted(self.queues):
            job = self.app.queue(queue).get(result_id)
            if job is not None and (job.task or "").startswith(RUNNER_PREFIX):
                task = import_string(job.payload["path"])
                return self._result(task, job, result_id)
        raise TaskResultDoesNotExist(result_id)

    def _result(self, task: Task, job: Job, job_id: str) -> TaskResult:
        finished = job.status not in (JobStatus.PENDING, JobStatus.PROCESSING)
        result: TaskResult = TaskResult(
            task=task, id=job_id, status=_STATUSES.get(job.status, TaskResultStatus.FAILED),
            enqueued_at=job.created_at, started_at=job.updated_at if job.attempts else None,
            last_attempted_at=job.updated_at if job.attempts else None,
            finished_at=job.updated_at if finished else None,
            args=job.payload["args"], kwargs=job.payload["kwargs"], backend=self.alias,
            errors=_errors(job), worker_ids=[job.worker_id] if job.worker_id else [])
        if job.status == JobStatus.DONE:
            object.__setattr__(result, "_return_value", job.result)
        return result


def _delay_s(run_after: datetime | None) -> float:
    if run_after is None:
        return 0.0
    return max((run_after - timezone.now()).total_seconds(), 0.0)


def _errors(job: Job) -> list[TaskError]:
    if not job.error or job.status in (JobStatus.PENDING, JobStatus.DONE):
        return []
    text = job.error.removeprefix("Permanent: ")
    path = text.split(":", 1)[0] if ":" in text else "builtins.Exception"
    return [TaskError(exception_class_path=path, traceback=job.error)]
