"""A backend for Django's task framework (the ``django_tasks`` backport on Django 5.2; the
same API as Django 6's ``django.tasks``). Tested with django-tasks 0.12 on Django 5.2::

    TASKS = {"default": {"BACKEND": "leaseq.contrib.django.tasks.LeaseqBackend",
                         "QUEUES": ["default"]}}

A Django task becomes a leaseq job on the queue of its ``queue_name``, run by
``manage.py leaseq_worker`` through one leaseq task per queue (``django_tasks:<queue>``)
registered on ``settings.LEASEQ_APP``'s App. The result id is the job id. Django's tasks have
no retries: an exception fails the task for good (``failed``, reason ``permanent``), as with
Django's own backends; ``run_after`` becomes the job's delay. A ``takes_context=True`` task
gets a ``TaskContext``; ``task_enqueued`` is sent where the task is enqueued,
``task_started`` and ``task_finished`` in the worker that runs it, as Django's own backends
do. The result's ``started_at`` is the job's first claim, ``last_attempted_at`` its latest,
and ``worker_ids`` the worker of each claim (its journal's ``claimed`` events), so
``attempts`` counts claims, a redelivery after a lost lease included.
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
from django_tasks.base import Task, TaskContext, TaskError
from django_tasks.exceptions import TaskResultDoesNotExist
from django_tasks.signals import task_enqueued, task_finished, task_started
from django_tasks.utils import get_exception_traceback, get_module_path, normalize_json

from leaseq.app import App
from leaseq.job import Job, JobStatus, Permanent
from leaseq.journal import JournalEvent

RUNNER_PREFIX = "django_tasks:"
_STATUSES: dict[str, Any] = {JobStatus.PENDING: TaskResultStatus.READY,
                              JobStatus.PROCESSING: TaskResultStatus.RUNNING,
                              JobStatus.DONE: TaskResultStatus.SUCCESSFUL}


def run_django_task(path: str, args: list[Any], kwargs: dict[str, Any], job: Job) -> Any:
    """The leaseq handler of every Django task: import the task and call it (``args`` and
    ``kwargs`` are the job's too), between the ``task_started`` and ``task_finished``
    signals."""
    task: Task = import_string(path)
    backend = task.get_backend()
    if not isinstance(backend, LeaseqBackend):
        raise Permanent(f"task {path}: its backend {task.backend!r} is no LeaseqBackend now")
    result = backend.result_of(task, job)
    task_started.send(type(backend), task_result=result)
    try:
        value = _call(task, result)
    except Exception as exc:
        result.errors.append(TaskError(exception_class_path=get_module_path(type(exc)),
                                       traceback=get_exception_traceback(exc)))
        _finish(backend, result, TaskResultStatus.FAILED)
        kind = type(exc)
        raise Permanent(f"{kind.__module__}.{kind.__qualname__}: {exc}") from exc
    object.__setattr__(result, "_return_value", normalize_json(value))
    _finish(backend, result, TaskResultStatus.SUCCESSFUL)
    return value


def _call(task: Task, result: TaskResult) -> Any:
    if task.takes_context:
        return task.call(TaskContext(task_result=result), *result.args, **result.kwargs)
    return task.call(*result.args, **result.kwargs)


def _finish(backend: BaseTaskBackend, result: TaskResult, status: Any) -> None:
    """Mark the running result finished with ``status`` (a ``TaskResultStatus``) and send
    ``task_finished`` (a failure's receivers log it with ``logger.exception``: call this
    while handling the exception)."""
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
    task_finished.send(type(backend), task_result=result)


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
        result = self.result_of(task, job)  # type: ignore[arg-type]
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        for queue in sorted(self.queues):
            job = self.app.queue(queue).get(result_id)
            if job is not None and (job.task or "").startswith(RUNNER_PREFIX):
                task = import_string(job.payload["path"])
                return self.result_of(task, job)
        raise TaskResultDoesNotExist(result_id)

    def result_of(self, task: Task, job: Job) -> TaskResult:
        """The ``TaskResult`` of the job: its times and workers from the job's claims."""
        finished = job.status not in (JobStatus.PENDING, JobStatus.PROCESSING)
        claims = [e for e in self.app.queue(job.queue).journal(job.id)
                  if e.event == JournalEvent.CLAIMED]
        result: TaskResult = TaskResult(
            task=task, id=job.id, status=_STATUSES.get(job.status, TaskResultStatus.FAILED),
            enqueued_at=job.created_at, started_at=claims[0].at if claims else None,
            last_attempted_at=claims[-1].at if claims else None,
            finished_at=job.updated_at if finished else None,
            args=job.payload["args"], kwargs=job.payload["kwargs"], backend=self.alias,
            errors=_errors(job), worker_ids=[e.worker_id or "" for e in claims])
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
