"""The worker for a Django project: Django's connection hygiene around every job.

Django closes a request's connections when the request ends; a worker has no requests, so
``close_old_connections()`` runs before and after every job, where that job's connections
live: a connection that broke (a database restart) or outlived ``CONN_MAX_AGE`` is replaced,
never handed to the next job.

* A sync handler runs on a pool thread, with Django connections of its own: the clean-up runs
  on that thread.
* An ``async def`` handler runs on the worker's event loop, which has no connection; Django's
  async API (``await Model.objects.aget(...)``, ``sync_to_async``) runs its queries on the
  thread-sensitive thread (asgiref's single thread for a loop outside ``async_to_sync``, the
  one every async job of this worker shares). The clean-up runs there through
  ``sync_to_async``, as Django's ASGI handler runs it with ``request_started`` and
  ``request_finished``. Another async job on that thread never loses a transaction to it:
  Django's transactions are sync, each inside one ``sync_to_async`` call, and the thread runs
  one call at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from leaseq.app import App
from leaseq.runner import InFlight, Runner
from leaseq.worker import Worker, WorkerConfig


class DjangoWorker(Worker):
    """A ``leaseq.Worker`` that calls ``close_old_connections()`` around every job."""

    def __init__(self, app: App, config: WorkerConfig | None = None, **options: Any):
        super().__init__(app, config, **options)
        # This worker's own Runner, wrapped in place: Runner has no hook around a job
        _refresh_around_sync_jobs(self._runner)
        _refresh_around_async_jobs(self._runner)


def _refresh_around_sync_jobs(runner: Runner) -> None:
    run_sync = runner.run_sync

    def run_with_fresh_connections(item: InFlight) -> str:
        close_old_connections()
        try:
            return run_sync(item)
        finally:
            close_old_connections()

    runner.run_sync = run_with_fresh_connections  # type: ignore[method-assign]


def _refresh_around_async_jobs(runner: Runner) -> None:
    run_async = runner.run_async

    async def refresh() -> None:
        await sync_to_async(close_old_connections, thread_sensitive=True)()

    async def run_with_fresh_connections(item: InFlight,
                                         finish_in: Callable[..., Any]) -> str:
        await refresh()
        try:
            return await run_async(item, finish_in)
        finally:
            await refresh()

    runner.run_async = run_with_fresh_connections  # type: ignore[method-assign]


def run(app: App, config: WorkerConfig, stop: threading.Event | None = None) -> None:
    """Run a ``DjangoWorker`` until stopped (SIGTERM/SIGINT when ``stop`` is None)."""
    worker = DjangoWorker(app, config)
    worker.run(stop, handle_signals=stop is None)
