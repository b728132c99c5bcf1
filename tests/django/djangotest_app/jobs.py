"""The tests' leaseq App on Django's connection, and a django-tasks task."""

from __future__ import annotations

import os

from django_tasks import task

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
