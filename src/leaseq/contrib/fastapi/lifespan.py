"""The FastAPI lifespan (the store's life, an optional embedded worker) and the queue
dependency."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request

from leaseq.app import App
from leaseq.queue import Queue
from leaseq.worker import Worker, WorkerConfig

#: Where the lifespan keeps the App on ``FastAPI.state``.
STATE_KEY = "leaseq"


def lifespan(jobs: App, *, worker: WorkerConfig | bool = False
             ) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """A ``FastAPI(lifespan=...)`` that opens ``jobs``'s store at start-up (off the event
    loop) and, at shutdown, releases the async connections it used on the server's loop and
    closes the store if it opened it (``App.close_store``: the next start-up opens a fresh
    one; a store the App had open already stays open). ``worker``: ``True`` or a
    ``WorkerConfig`` runs an embedded worker on a thread of its own, stopped (and drained
    within its ``grace_s``) before the store closes."""
    config = WorkerConfig() if worker is True else worker or None

    @asynccontextmanager
    async def run(api: FastAPI) -> AsyncIterator[None]:
        opens = not jobs.has_open_store()
        store = await asyncio.to_thread(lambda: jobs.store)
        setattr(api.state, STATE_KEY, jobs)
        embedded = EmbeddedWorker(jobs, config) if config is not None else None
        try:
            if embedded is not None:
                embedded.start()
            yield
        finally:
            if embedded is not None:
                await asyncio.to_thread(embedded.stop)
            await store.aclose()
            if opens:
                await asyncio.to_thread(jobs.close_store)

    return run


class EmbeddedWorker:
    """A ``Worker`` on a thread of the server's process, stopped by ``stop()``."""

    def __init__(self, jobs: App, config: WorkerConfig):
        self.worker = Worker(jobs, config)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.worker.run, args=(self._stop,),
                                        name="leaseq-embedded-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop claiming and wait for the drain (in-flight jobs finish or are given back)."""
        self._stop.set()
        self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()


def app_of(request: Request) -> App:
    """The App the lifespan put on the FastAPI app's state."""
    jobs: Any = getattr(request.app.state, STATE_KEY, None)
    if not isinstance(jobs, App):
        raise RuntimeError("leaseq's lifespan is not installed: FastAPI(lifespan="
                           "leaseq.contrib.fastapi.lifespan(jobs))")
    return jobs


def queue_dependency(name: str) -> Callable[[Request], Queue]:
    """A dependency handing the path operation the ``Queue`` ``name`` of the lifespan's App."""
    def get_queue(request: Request) -> Queue:
        return app_of(request).queue(name)

    return get_queue
