"""The worker for a Django project: Django's connection hygiene around every job.

Handlers run on the worker's threads, each with Django connections of its own. Django closes
a request's connections when the request ends; a worker has no requests, so
``close_old_connections()`` runs before and after every job: a connection that broke (a
database restart) or outlived ``CONN_MAX_AGE`` is replaced, never handed to the next job.
"""

from __future__ import annotations

import threading
from typing import Any

from django.db import close_old_connections

from leaseq.app import App
from leaseq.runner import InFlight
from leaseq.worker import Worker, WorkerConfig


class DjangoWorker(Worker):
    """A ``leaseq.Worker`` that calls ``close_old_connections()`` around every job."""

    def __init__(self, app: App, config: WorkerConfig | None = None, **options: Any):
        super().__init__(app, config, **options)
        run_sync = self._runner.run_sync

        def run_with_fresh_connections(item: InFlight) -> str:
            close_old_connections()
            try:
                return run_sync(item)
            finally:
                close_old_connections()

        # This worker's own Runner, wrapped in place: Runner has no hook around a sync job
        self._runner.run_sync = run_with_fresh_connections  # type: ignore[method-assign]


def run(app: App, config: WorkerConfig, stop: threading.Event | None = None) -> None:
    """Run a ``DjangoWorker`` until stopped (SIGTERM/SIGINT when ``stop`` is None)."""
    worker = DjangoWorker(app, config)
    worker.run(stop, handle_signals=stop is None)
