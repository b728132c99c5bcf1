"""The asyncio face of ``Queue``, ``App`` and ``Task``, and waiting for a job's result.

The ``a`` prefix marks the coroutine twin of a method, as in Django and pymongo:
``await task.aenqueue(...)``, ``await q.aget(job_id)``. Input is validated exactly as the
blocking method does (pure Python, no I/O); the store call is awaited. Stores with a native
async driver use it (PostgreSQL: psycopg's ``AsyncConnection``, and ``connection=`` takes
the caller's ``psycopg.AsyncConnection``); the others (SQLite) run the blocking call in a
worker thread, so the event loop is never held by the database either way.

``q.wait(job_id, timeout_s)`` and ``await q.await_result(job_id, timeout_s)`` return the
finished ``Job`` (done, failed, cancelled or an app terminal status) or raise
``TimeoutError``. They sleep on the store's change signal (``Store.watch_finish``): NOTIFY on
PostgreSQL, the change counter on SQLite, a poll elsewhere; never a busy loop.
"""

from __future__ import annotations

import asyncio
import time
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from leaseq import validate
from leaseq.errors import InvalidInput, JobNotFound
from leaseq.job import EnqueueResult, Job, JobSpec, JournalEntry, OnConflict, is_terminal

if TYPE_CHECKING:
    from leaseq.app import App, Task
    from leaseq.queue import Queue
    from leaseq.stores.base import Store
    from leaseq.stores.watch import FinishWatch

_ON_CONFLICT = typing.get_args(OnConflict)


class AsyncQueueMethods:
    """``Queue``'s coroutine twins and its result waits (mixed into ``Queue``)."""

    store: Store
    name: str

    # self: Queue, the host, so the body is checked in full (mypy wants the mixin's supertype)
    async def aenqueue(self: Queue, job_id: str,  # type: ignore[misc]
                       payload: Mapping[str, Any], *, task: str | None = None,
                       revision: str | None = None, delay_s: float = 0,
                       max_attempts: int | None = None, priority: int = 0,
                       concurrency_key: str | None = None, on_conflict: OnConflict = "raise",
                       connection: Any = None) -> EnqueueResult:
        """``enqueue`` for asyncio callers; ``connection=``: the caller's async connection."""
        spec = self.spec(job_id, payload, task=task, revision=revision, delay_s=delay_s,
                         max_attempts=max_attempts, priority=priority,
                         concurrency_key=concurrency_key)
        return (await self._aenqueue([spec], on_conflict, connection))[0]

    # self: Queue, the host, so the body is checked in full (mypy wants the mixin's supertype)
    async def aenqueue_many(self: Queue,  # type: ignore[misc]
                            jobs: Iterable[JobSpec | Mapping[str, Any]], *,
                            on_conflict: OnConflict = "raise", connection: Any = None
                            ) -> list[EnqueueResult]:
        """``enqueue_many`` for asyncio callers: one transaction, all validated first."""
        specs = [j if isinstance(j, JobSpec) else self._spec_from_dict(j) for j in jobs]
        return await self._aenqueue(specs, on_conflict, connection) if specs else []

    async def _aenqueue(self, specs: Sequence[JobSpec], on_conflict: OnConflict,
                        connection: Any) -> list[EnqueueResult]:
        if on_conflict not in _ON_CONFLICT:
            raise InvalidInput(f"on_conflict must be one of {', '.join(_ON_CONFLICT)}")
        results = await self.store.aenqueue_many(self.name, specs, on_conflict, connection)
        if connection is None:  # in a caller's transaction the job is visible only at commit
            self.store.notify_local(self.name)
        return results

    async def aget(self, job_id: str) -> Job | None:
        return await self.store.aget(self.name, validate.job_id(job_id))

    async def acounts(self) -> dict[str, int]:
        return await self.store.acounts(self.name)

    async def ajournal(self, job_id: str) -> list[JournalEntry]:
        return await self.store.ajournal(self.name, validate.job_id(job_id))

    async def arequeue(self, job_id: str) -> bool:
        """``requeue`` (the operator's re-drive of a terminal job) for asyncio callers."""
        return await self.store.arequeue(self.name, validate.job_id(job_id))

    async def acancel(self, job_id: str) -> bool:
        return await self.store.acancel(self.name, validate.job_id(job_id))

    # --- waiting for a result ---------------------------------------------------------------

    def wait(self, job_id: str, timeout_s: float) -> Job:
        """Block until the job is finished and return it; ``TimeoutError`` after
        ``timeout_s``; ``JobNotFound`` when there is no such job."""
        job_id, deadline = self._wait_args(job_id, timeout_s)
        with self.store.watch_finish(self.name, job_id) as watch:
            while True:
                left = self._finished_or_left(self.store.get(self.name, job_id), job_id,
                                              deadline, timeout_s)
                if isinstance(left, Job):
                    return left
                watch.wait(left)

    async def await_result(self, job_id: str, timeout_s: float) -> Job:
        """``wait`` for asyncio callers: the finished job, or ``TimeoutError``."""
        job_id, deadline = self._wait_args(job_id, timeout_s)
        watch = await _watch_off_the_loop(self.store, self.name, job_id)
        try:
            while True:
                left = self._finished_or_left(await self.store.aget(self.name, job_id),
                                              job_id, deadline, timeout_s)
                if isinstance(left, Job):
                    return left
                await watch.await_(left)
        finally:
            watch.close()

    @staticmethod
    def _wait_args(job_id: str, timeout_s: float) -> tuple[str, float]:
        timeout = validate.delay_s(timeout_s, "timeout_s")
        return validate.job_id(job_id), time.monotonic() + timeout

    def _finished_or_left(self, job: Job | None, job_id: str, deadline: float,
                          timeout_s: float) -> Job | float:
        """The job when finished, else the seconds left to wait (``TimeoutError`` at 0)."""
        if job is None:
            raise JobNotFound(self.name, job_id)
        if is_terminal(job.status):
            return job
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"job {job_id[:100]!r} of queue {self.name!r} did not finish "
                               f"within {timeout_s:g} s (it is {job.status})")
        return left


class AsyncTaskMethods:
    """``Task``'s coroutine twins (mixed into ``Task``)."""

    # self: Task, the host, so the body is checked in full (mypy wants the mixin's supertype)
    async def aenqueue(self: Task, *args: Any, job_id: str | None = None,  # type: ignore[misc]
                       revision: str | None = None, delay_s: float = 0,
                       priority: int | None = None, concurrency_key: str | None = None,
                       on_conflict: OnConflict = "raise", connection: Any = None,
                       **kwargs: Any) -> EnqueueResult:
        """``enqueue`` for asyncio callers; ``connection=``: the caller's async connection."""
        payload = self.signature.payload_from_call(args, kwargs)
        return await self.aenqueue_payload(payload, job_id=job_id, revision=revision,
                                           delay_s=delay_s, priority=priority,
                                           concurrency_key=concurrency_key,
                                           on_conflict=on_conflict, connection=connection)

    # self: Task, the host, so the body is checked in full (mypy wants the mixin's supertype)
    async def aenqueue_payload(self: Task, payload: dict[str, Any], *,  # type: ignore[misc]
                               job_id: str | None = None, revision: str | None = None,
                               delay_s: float = 0, priority: int | None = None,
                               concurrency_key: str | None = None,
                               on_conflict: OnConflict = "raise",
                               connection: Any = None) -> EnqueueResult:
        self.signature.check(payload)
        queue = await aqueue(self.app, self.queue)
        spec = self._spec(payload, job_id, revision, delay_s, priority=priority,
                          concurrency_key=concurrency_key)
        return (await queue.aenqueue_many([spec], on_conflict=on_conflict,
                                          connection=connection))[0]


class AsyncAppMethods:
    """``App``'s coroutine twins (mixed into ``App``)."""

    # self: App, the host, so the body is checked in full (mypy wants the mixin's supertype)
    async def aenqueue(self: App, task: str | Task,  # type: ignore[misc]
                       payload: Mapping[str, Any] | None = None, **options: Any
                       ) -> EnqueueResult:
        """``enqueue`` for asyncio callers: a task by name with a payload dict."""
        return await self._find_task(task).aenqueue_payload(dict(payload or {}), **options)


async def _watch_off_the_loop(store: Store, queue: str, job_id: str) -> FinishWatch:
    """``store.watch_finish`` made in a thread. A caller cancelled meanwhile (a timeout around
    ``await_result``) does not stop the thread: the watch it makes then is closed at once,
    not left registered among the finish waiters."""
    made = asyncio.ensure_future(asyncio.to_thread(store.watch_finish, queue, job_id))
    try:
        return await asyncio.shield(made)
    except asyncio.CancelledError:
        made.add_done_callback(_close_made_watch)
        raise


def _close_made_watch(made: asyncio.Future[FinishWatch]) -> None:
    if not made.cancelled() and made.exception() is None:
        made.result().close()


async def aqueue(app: App, name: str) -> Queue:
    """``app.queue(name)``, with the store's first opening (blocking I/O) off the loop."""
    if app.has_open_store():
        return app.queue(name)
    return await asyncio.to_thread(app.queue, name)
