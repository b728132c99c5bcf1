"""The tests' leaseq App on Django's connection, and a django-tasks task."""

from __future__ import annotations

import datetime
import os
import threading

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


#: Events the interleaving tests set: the handlers below wait on them or set them.
turns: dict[str, threading.Event] = {}


@app.task(queue="interleave")
async def iterate_across_another_job() -> int:
    """Read ``ContentType`` rows one chunk at a time (an open cursor between chunks), waiting
    after the first chunk for ``turns["other_job_cleaned_up"]``."""
    import asyncio

    from django.contrib.contenttypes.models import ContentType

    rows = 0
    async for _ in ContentType.objects.all().aiterator(chunk_size=1):
        rows += 1
        if rows == 1:
            turns["iterating"].set()
            cleaned = await asyncio.to_thread(turns["other_job_cleaned_up"].wait, 10)
            assert cleaned, "the other job was not cleaned up within 10 s"
    return rows


@app.task(queue="interleave")
async def quick_count() -> int:
    """Count ``ContentType`` rows once the other job is mid-iteration."""
    import asyncio

    from django.contrib.contenttypes.models import ContentType

    await asyncio.to_thread(turns["iterating"].wait, 10)
    count = await ContentType.objects.acount()
    turns["quick_returned"].set()
    return count


@app.task(queue="hang")
def hang(marker: str, seconds: float) -> None:
    """Touch ``marker``, block for ``seconds`` (deaf to a shutdown), then touch
    ``marker + ".end"``: a handler that outlives a worker's grace period."""
    import time
    from pathlib import Path

    Path(marker).touch()
    time.sleep(seconds)
    Path(marker + ".end").touch()


@task()
def returns_a_datetime() -> datetime.datetime:
    """A return value JSON cannot hold."""
    return datetime.datetime.now(datetime.UTC)


@task(backend="immediate", takes_context=True)
def reports_its_task(context: TaskContext) -> dict[str, object]:
    """Declared on another backend: what its run sees of its ``Task``."""
    task = context.task_result.task
    return {"backend": task.backend, "queue_name": task.queue_name,
            "run_after": task.run_after.isoformat() if task.run_after else None}
