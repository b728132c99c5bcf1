"""Group commit for finished jobs: many completions, one fenced statement.

Handler threads hand their result to the completer (``submit``) and go on to their next job;
one thread takes everything that is waiting, writes it with ``Store.complete_many`` (one
transaction per queue), and answers each item with its own outcome through its callback. Nothing
waits on a timer: a lone job is written at once, and under load the batch is simply whatever
finished while the previous write ran. A job counts as finished only when its batch committed:
until it is answered the worker keeps it in flight, under the lease its last beat extended (the
heartbeat leaves it alone from the hand-over: a beat racing the commit would see a finished job
and journal its lease lost). The fence decides a batch that outlives that lease.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from leaseq.job import Completion, Job, Lease
from leaseq.logfields import queue_fields
from leaseq.queue import Queue

log = logging.getLogger(__name__)

#: What a completion is answered with: the finished ``Job``, the ``LeaseLost`` it met (fenced
#: out), or the store's error.
Answer = Callable[["Job | BaseException"], None]

#: Most completions written in one statement. Defaults to 256.
MAX_BATCH = 256


@dataclass(slots=True, eq=False)
class _Item:
    queue: Queue
    lease: Lease
    result_json: str | None
    status: str
    result_key: str | None
    answer: Answer
    answered: bool = False


class Completer:
    def __init__(self, max_batch: int = MAX_BATCH):
        self.max_batch = max_batch
        self._waiting: list[_Item] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="leaseq-completer", daemon=True)
        self._thread.start()

    def submit(self, queue: Queue, lease: Lease, result_json: str | None, status: str,
               result_key: str | None, answer: Answer) -> None:
        """Queue one completion for the next batch without waiting. ``answer`` is called once,
        after the batch committed (on the completer's thread): with the finished ``Job``,
        ``LeaseLost`` (fenced out) or the store's error. After ``close`` the completion is
        written at once, in the caller's thread."""
        item = _Item(queue, lease, result_json, status, result_key, answer)
        with self._cond:  # decided under the lock, so an item is written by one side only
            write_here = self._closed
            if not write_here:
                self._waiting.append(item)
                self._cond.notify()
        if write_here:
            try:
                self._write([item])  # a handler that outlived its worker writes on its own
            except BaseException as exc:
                _settle([item], exc)

    def close(self) -> None:
        """Write what is waiting, then stop; later completions are written one by one."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if not self._waiting:
                    return
                batch = self._waiting[: self.max_batch]
                del self._waiting[: self.max_batch]
            try:
                self._write(batch)
            except BaseException as exc:  # never die with waiters parked on this thread
                _settle(batch, exc)

    def _write(self, batch: list[_Item]) -> None:
        by_queue: dict[str, list[_Item]] = defaultdict(list)
        for item in batch:
            by_queue[item.queue.name].append(item)
        for items in by_queue.values():
            try:
                outcomes = items[0].queue.store.complete_many(
                    items[0].queue.name,
                    [Completion(i.lease, i.result_json, i.status, i.result_key) for i in items])
            except BaseException as exc:  # each waiter decides (retry, give up) on its own
                _settle(items, exc)
                continue
            for item, outcome in zip(items, outcomes, strict=True):
                _answer(item, outcome)


def _answer(item: _Item, outcome: Job | BaseException) -> None:
    if item.answered:
        return
    item.answered = True
    try:
        item.answer(outcome)
    except Exception as exc:  # one waiter's failure must not leave the others unanswered
        log.error("job %s: handling its completion failed (%s)", item.lease.job_id,
                  type(exc).__name__,
                  extra=queue_fields("worker_error", item.queue.name, item.lease.job_id))


def _settle(items: list[_Item], exc: BaseException) -> None:
    """Fail the waiters not yet answered (an earlier write may already have answered some)."""
    for item in items:
        _answer(item, exc)
