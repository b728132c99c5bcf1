"""The FastAPI lifespan (the store's life, an optional embedded worker) and the queue
dependency."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request

from leaseq.app import App
from leaseq.logfields import queue_fields
from leaseq.queue import Queue
from leaseq.redact import traceback_text
from leaseq.stores.base import Store
from leaseq.worker import Worker, WorkerConfig

log = logging.getLogger(__name__)

#: Where the lifespan keeps the App on ``FastAPI.state``.
STATE_KEY = "leaseq"


def lifespan(jobs: App, *, worker: WorkerConfig | bool = False
             ) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """A ``FastAPI(lifespan=...)`` that opens ``jobs``'s store at start-up (off the event
    loop) and, at shutdown, releases the async connections it used on the server's loop and
    closes the store if it opened it (``App.close_store``: the next start-up opens a fresh
    one; a store the App had open already stays open). ``worker``: ``True`` or a
    ``WorkerConfig`` runs an embedded worker on a thread of its own; a worker that cannot be
    built or started fails the start-up (the store is closed all the same); at shutdown it
    is stopped (and drained within its ``grace_s``) before the store closes, and what ended
    it early, if anything did, is raised then."""
    config = WorkerConfig() if worker is True else worker or None

    @asynccontextmanager
    async def run(api: FastAPI) -> AsyncIterator[None]:
        opens = not jobs.has_open_store()
        store = await asyncio.to_thread(lambda: jobs.store)
        setattr(api.state, STATE_KEY, jobs)
        embedded: EmbeddedWorker | None = None
        try:
            if config is not None:
                embedded = EmbeddedWorker(jobs, config)
                await asyncio.to_thread(embedded.start)
            yield
        finally:
            try:
                if embedded is not None:
                    await asyncio.to_thread(embedded.stop)
            finally:
                await _close(jobs, store, opens)

    return run


async def _close(jobs: App, store: Store, opens: bool) -> None:
    await store.aclose()
    if opens:
        await asyncio.to_thread(jobs.close_store)


class EmbeddedWorker:
    """A ``Worker`` on a thread of the server's process: ``start()`` returns once it works
    (or raises why it could not start), ``stop()`` drains it."""

    def __init__(self, jobs: App, config: WorkerConfig):
        self.worker = Worker(jobs, config)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        """What ended the worker's ``run``, until ``start()`` or ``stop()`` raised it."""
        self._thread = threading.Thread(target=self._run, name="leaseq-embedded-worker",
                                        daemon=True)

    def start(self) -> None:
        """Start the thread and wait until the worker's loop runs; raises what ended it
        before that (its metrics port taken, say), so the server's start-up fails with it."""
        self._thread.start()
        self.worker.started.wait()  # set by the worker once it works, or by _run once it ended
        if self._error is not None:
            self._thread.join()
            self._raise()

    def stop(self) -> None:
        """Stop claiming and wait for the drain (in-flight jobs finish or are given back);
        raises what ended the worker early, if anything did."""
        self._stop.set()
        self.worker.request_stop()  # wakes a worker idle in wait_for_work at once
        self._thread.join()
        stragglers = self.worker.stragglers()
        if stragglers:
            log.warning(_STRAGGLERS, stragglers, extra=queue_fields("grace_expired"))
        if self._error is not None:
            self._raise()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            self.worker.run(self._stop)
        except BaseException as exc:  # start() or stop() raises it in the server's thread
            self._error = exc
            if self.worker.started.is_set():  # the app serves on, and nothing runs its jobs
                log.error("the embedded worker stopped: no job runs in this process until "
                          "the server restarts\n%s", traceback_text(exc, self.worker.app.redact),
                          extra=queue_fields("worker_error"))
        finally:
            self.worker.started.set()  # start() waits no longer for a worker that ended

    def _raise(self) -> None:
        error, self._error = self._error, None  # raised once, by start() or by stop()
        assert error is not None
        raise error


#: What becomes of a straggler depends on how the server ends, not on leaseq: uvicorn
#: re-raises the signal it caught once the shutdown is done, and SIGTERM's default action
#: ends the process at once, while SIGINT's KeyboardInterrupt lets Python wait for the
#: pool's threads (they are not daemons).
_STRAGGLERS = (
    "the embedded worker stopped with %d sync handler(s) still running in its thread pool: "
    "their jobs are no longer this worker's (given back at the end of the grace period, or "
    "let go when their lease ran out) and will run again; a handler's thread is cut off "
    "mid-run when the server's process ends (uvicorn re-raises SIGTERM once the shutdown is "
    "done), or holds up the exit until it returns (SIGINT, or a server that exits on its "
    "own); see the FastAPI section of docs/integrations.md")


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
