"""The tests' leaseq App on Django's connection, and a django-tasks task."""

from __future__ import annotations

import os

from django_tasks import TaskContext, task

from leaseq import App

app = App(url=os.environ.get("LEASEQ_DJANGO_URL", "django://default"))


@app.task(queue="mail")
def send_mail(to: str) -> dict[str, str]:
    return {"sent_to": to}


@app.task(queue="mail")
def always_fails(reason: str) -> None:
    raise ValueError(reason)


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
def explode() -> None:
    raise KeyError("no such thing")


@app.task(queue="mail")
async def count_jobs_async(lane: str) -> int:
    """An async handler reading through Django's thread (as the async ORM would)."""
    from asgiref.sync import sync_to_async

    return await sync_to_async(lambda: sum(app.queue(lane).counts().values()),
                               thread_sensitive=True)()


@app.task(queue="orm")
async def orm_probe(break_connection: bool = False) -> dict[str, object]:
    """An async handler on Django's async ORM: the count it read, the thread its query ran on
    and when (``time.monotonic_ns``). ``break_connection`` then closes the database connection
    under Django, as a database restart would: Django still believes it open."""
    import threading
    import time

    from asgiref.sync import sync_to_async
    from django.contrib.contenttypes.models import ContentType
    from django.db import connection

    count = await ContentType.objects.acount()
    thread = await sync_to_async(lambda: threading.current_thread().name)()
    at = time.monotonic_ns()
    if break_connection:
        await sync_to_async(lambda: connection.connection.close())()
    return {"count": count, "thread": thread, "at": at}


@task(takes_context=True)
def knows_its_context(context: TaskContext, tag: str) -> dict[str, object]:
    return {"tag": tag, "id": context.task_result.id, "attempt": context.attempt}
