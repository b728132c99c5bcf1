"""The worker for a Django project: Django's connection hygiene around every job.

Django closes a request's connections when the request ends; a worker has no requests, so it
cleans up around every job, where that job's connections live: a connection that broke (a
database restart) or outlived ``CONN_MAX_AGE`` is replaced, never handed to the next job.

* A sync handler runs on a pool thread, with Django connections of its own:
  ``close_old_connections()`` runs on that thread before and after the job.
* An ``async def`` handler runs on the worker's event loop, which has no connection; Django's
  async API (``await Model.objects.aget(...)``, ``sync_to_async``) runs its queries on the
  thread-sensitive thread. Each async job gets one of its own, as Django's ASGI handler gives
  each request one: the job runs inside an ``asgiref`` ``ThreadSensitiveContext``, so its ORM
  calls share one new thread and connection, which is closed when the job ends. Outside such
  a context every async job of the worker would share asgiref's one thread, and one job's
  clean-up would close the connection under another (an ``aiterator()`` between chunks).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.db import close_old_connections, connections

from leaseq.app import App
from leaseq.runner import InFlight, Runner
from leaseq.worker import Worker, WorkerConfig


class DjangoWorker(Worker):
    """A ``leaseq.Worker`` that cleans up Django's connections around every job."""

    def __init__(self, app: App, config: WorkerConfig | None = None, **options: Any):
        super().__init__(app, config, **options)
        # This worker's own Runner, wrapped in place: Runner has no hook around a job
        _refresh_around_sync_jobs(self._runner)
        _own_connections_for_async_jobs(self._runner)


def _refresh_around_sync_jobs(runner: Runner) -> None:
    run_sync = runner.run_sync

    def run_with_fresh_connections(item: InFlight) -> str:
        close_old_connections()
        try:
            return run_sync(item)
        finally:
            close_old_connections()

    runner.run_sync = run_with_fresh_connections  # type: ignore[method-assign]


def _own_connections_for_async_jobs(runner: Runner) -> None:
    run_async = runner.run_async

    async def run_with_own_connections(item: InFlight,
                                       finish_in: Callable[..., Any]) -> str:
        async with ThreadSensitiveContext():
            try:
                return await run_async(item, finish_in)
            finally:
                # The context's thread ends with the job: its connections would never be
                # used again, whatever CONN_MAX_AGE says
                await sync_to_async(connections.close_all, thread_sensitive=True)()

    runner.run_async = run_with_own_connections  # type: ignore[method-assign]


def run(app: App, config: WorkerConfig, stop: threading.Event | None = None) -> DjangoWorker:
    """Run a ``DjangoWorker`` until stopped (SIGTERM/SIGINT when ``stop`` is None); returns
    it, for ``has_stragglers``."""
    worker = DjangoWorker(app, config)
    worker.run(stop, handle_signals=stop is None)
    return worker
