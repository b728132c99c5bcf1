"""A backend for Django's task framework (the ``django_tasks`` backport on Django 5.2; the
same API as Django 6's ``django.tasks``). Tested with django-tasks 0.12 on Django 5.2::

    TASKS = {"default": {"BACKEND": "leaseq.contrib.django.tasks.LeaseqBackend",
                         "QUEUES": ["default"]}}

A Django task becomes a leaseq job on the queue of its ``queue_name``, run by
``manage.py leaseq_worker`` through one leaseq task per queue (``django_tasks:<queue>``)
registered on ``settings.LEASEQ_APP``'s App. The result id is the job id. Django's tasks have
no retries: an exception, or a return value JSON cannot hold, fails the task for good
(``failed``, reason ``permanent``), as with Django's own backends; ``run_after`` becomes the
job's delay. What ``Task.using`` set (backend, queue, priority, ``run_after``) is saved with
the job, and the worker and ``get_result`` make the task so again. ``QUEUES`` must name the
queues (an empty list, Django's "any queue", is refused: a worker serves named queues). A
``takes_context=True`` task gets a ``TaskContext``; ``task_enqueued`` is sent where the task
is enqueued (inside ``atomic()`` too, before the commit: a rollback does not take it back),
``task_started`` and ``task_finished`` in the worker that runs it, as Django's own backends
do. The result's ``started_at`` is the job's first claim, ``last_attempted_at`` its latest,
and ``worker_ids`` the worker of each claim (its journal's ``claimed`` events), so
``attempts`` counts claims, a redelivery after a lost lease included.
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from django.utils.module_loading import import_string
from django_tasks import TaskResult, TaskResultStatus, task_backends
from django_tasks.backends.base import BaseTaskBackend
from django_tasks.base import Task, TaskContext, TaskError
from django_tasks.exceptions import (
    InvalidTaskBackendError,
    InvalidTaskError,
    TaskResultDoesNotExist,
)
from django_tasks.signals import task_enqueued, task_finished, task_started
from django_tasks.utils import get_exception_traceback, get_module_path, normalize_json

from leaseq import errors, validate
from leaseq.app import App
from leaseq.job import Job, JobStatus, Permanent
from leaseq.journal import JournalEvent

RUNNER_PREFIX = "django_tasks:"
_STATUSES: dict[str, Any] = {JobStatus.PENDING: TaskResultStatus.READY,
                              JobStatus.PROCESSING: TaskResultStatus.RUNNING,
                              JobStatus.DONE: TaskResultStatus.SUCCESSFUL}


def run_django_task(path: str, args: list[Any], kwargs: dict[str, Any], job: Job,
                    using: dict[str, Any] | None = None) -> Any:
    """The leaseq handler of every Django task: import the task, make it as enqueued
    (``using``: what ``Task.using`` set) and call it (``args`` and ``kwargs`` are the job's
    too), between the ``task_started`` and ``task_finished`` signals."""
    task = import_string(path)
    try:
        task = as_enqueued(task, using)
        backend = task.get_backend()
        if not isinstance(backend, LeaseqBackend):
            raise InvalidTaskError(f"task {path}: its backend {task.backend!r} is no "
                                   "LeaseqBackend now")
    except (InvalidTaskError, InvalidTaskBackendError) as exc:  # the settings changed since
        raise _permanent(exc) from exc
    result = backend.result_of(task, job)
    task_started.send(type(backend), task_result=result)
    try:
        # A return value JSON cannot hold fails the task, as in Django's own backends: after
        # the body, so never by running it again
        object.__setattr__(result, "_return_value", normalize_json(_call(task, result)))
    except KeyboardInterrupt:
        raise  # as Django's own backends: the one exception that is not the task's failure
    except BaseException as exc:
        result.errors.append(TaskError(exception_class_path=get_module_path(type(exc)),
                                       traceback=get_exception_traceback(exc)))
        _finish(backend, result, TaskResultStatus.FAILED)
        raise _permanent(exc) from exc
    _finish(backend, result, TaskResultStatus.SUCCESSFUL)
    return result._return_value


def enqueued_as(task: Task) -> dict[str, Any]:
    """What ``Task.using`` can set (``as_enqueued`` makes the task so again)."""
    return {"backend": task.backend, "queue_name": task.queue_name, "priority": task.priority,
            "run_after": task.run_after.isoformat() if task.run_after else None}


def as_enqueued(task: Task, using: dict[str, Any] | None) -> Task:
    """``task`` as ``enqueued_as`` saw it. A job enqueued by an older leaseq has no
    ``using``: its task as declared."""
    if not using:
        return task
    run_after = using.get("run_after")
    return task.using(backend=using.get("backend"), queue_name=using.get("queue_name"),
                      priority=using.get("priority"),
                      run_after=datetime.fromisoformat(run_after) if run_after else None)


def _permanent(exc: BaseException) -> Permanent:
    """The task's failure for good (Django's tasks have no retries), its reason led by the
    exception's class path (``TaskError.exception_class_path``)."""
    return Permanent(f"{get_module_path(type(exc))}: {exc}")


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
        super().__init__(alias, params)  # QUEUES defaults to ["default"]
        if not self.queues:
            # Django reads an empty list as "any queue name"; a worker serves named queues
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['QUEUES'] is empty, which Django reads as any queue name: "
                "leaseq's worker serves the queues listed there, so list them (or leave "
                "QUEUES out for ['default'])")
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
        payload: dict[str, Any] = {"path": task.module_path, "args": list(args),
                                   "kwargs": dict(kwargs)}
        using = enqueued_as(task)
        if using != enqueued_as(import_string(task.module_path)):
            # Only when Task.using changed it: a payload as before runs on a worker of an
            # older leaseq too (whose handler takes no "using"), so web and workers may be
            # upgraded in either order
            payload["using"] = using
        self.app.enqueue(RUNNER_PREFIX + task.queue_name, payload, job_id=job_id,
                         delay_s=_delay_s(task.run_after))
        job = self.app.queue(task.queue_name).get(job_id)
        # not None: enqueued just above
        result = self.result_of(task, job)  # type: ignore[arg-type]
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result; ``TaskResultDoesNotExist`` for an id no job has, or can have
        (empty, too long, with a NUL): Django's answer for an unknown id, which a view maps
        to a 404. ``aget_result``, ``Task.get_result`` and ``refresh()`` come here too."""
        try:
            result_id = validate.job_id(result_id)
        except errors.InvalidJobId:
            raise TaskResultDoesNotExist(result_id) from None
        for queue in sorted(self.queues):
            job = self.app.queue(queue).get(result_id)
            if job is not None and (job.task or "").startswith(RUNNER_PREFIX):
                task = as_enqueued(import_string(job.payload["path"]),
                                   job.payload.get("using"))
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
    return [TaskError(exception_class_path=_exception_path(job.error), traceback=job.error)]


def _exception_path(error: str) -> str:
    """The class path ``TaskError.exception_class`` imports for a failed job's error. A
    failure of the task is ``Permanent: module.Class: …`` (``_permanent``); one outside it
    (the task could not be imported, its lease ran out every time) names a class without its
    module, or none: a built-in's or leaseq's is found, any other is ``builtins.Exception``."""
    head = error.removeprefix("Permanent: ").split(":", 1)[0]
    if "." in head and all(part.isidentifier() for part in head.split(".")):
        return head
    for module in (builtins, errors):
        found = getattr(module, head, None) if head.isidentifier() else None
        if isinstance(found, type) and issubclass(found, BaseException):
            return get_module_path(found)
    return "builtins.Exception"
