"""How far ahead of its free slots a worker may claim, so that one claim takes a big batch.

A prefetched job is under lease and counted in flight, but waits for a slot. That is only worth
it when a slot will free soon, so the allowance is what the worker's own handlers have just
shown. Handlers may all finish at once (jobs claimed together, of one length), so the worst
case is counted, not the average: with slots held ``held_s`` on average, the ``k``-th wave of
``concurrency`` prefetched jobs starts after about ``k · held_s``; the allowance is the waves
that start within half of ``wait_s``, at most ``limit`` jobs. Handlers of microseconds earn
the whole ``limit``; a handler that holds its slot longer than ``wait_s / 2`` earns nothing,
and the worker claims only its free slots. This keeps prefetch out of the trap of a
prefetching broker, where one busy worker sits on jobs that another could start now.

The backstop is the worker's: a prefetched job that has not started within ``wait_s`` is given
back at once (free, not counted as a give-back), and ``reset`` forgets the history, so the
worker claims only free slots until its handlers have shown their pace again.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

#: Weight of the newest slot hold in the running average.
SMOOTHING = 0.1


class Prefetch:
    def __init__(self, limit: int, wait_s: float, concurrency: int):
        self.limit = limit
        """Most jobs claimed ahead of free slots; 0 turns prefetch off."""
        self.wait_s = wait_s
        """How long a prefetched job may wait for a slot."""
        self.concurrency = concurrency
        self._held_s: float | None = None

    def finished(self, held_s: float) -> None:
        """A handler gave its slot back after ``held_s``. Called from many threads: a lost
        update of the average only weighs one sample less."""
        held = self._held_s
        self._held_s = held_s if held is None else held + SMOOTHING * (held_s - held)

    def allowance(self) -> int:
        """Jobs that may be claimed beyond the free slots now."""
        held = self._held_s
        if not self.limit or held is None:
            return 0
        waves = self.wait_s / 2 / max(held, 1e-6)
        return min(self.concurrency * int(min(waves, self.limit)), self.limit)

    def reset(self) -> None:
        """A prefetched job waited too long: claim only free slots until jobs finish again."""
        self._held_s = None


class FullKeys:
    """Key-limited queues to leave out of a claim round for a moment. A keyed claim that comes
    back short found every key with ready jobs at its limit (or no more ready jobs); until one
    of the worker's own jobs of that queue leaves its lease, or ``recheck_s`` has passed (the
    worker's usual poll for other workers' finishes and new jobs), another claim would find
    the same keys full. Measured on a busy queue, half the keyed claims came back empty so,
    each holding the queue's limits lock (SQLite: the write lock) for nothing. While one of
    the worker's own jobs of the queue is being finished (its completion is being written),
    the recheck waits for that job to settle (for ``finishing_max_s`` at most, should its
    write be retried): it frees a slot within milliseconds, and a recheck meanwhile found the
    keys full again (it was most of the empty claims that were left). Not thread-safe: the
    worker calls ``settled`` under its lock and the rest from its loop."""

    def __init__(self, recheck_s: float, finishing_max_s: float | None = None):
        self.recheck_s = recheck_s
        self.finishing_max_s = max(recheck_s, finishing_max_s or recheck_s)
        self._settled: collections.Counter[str] = collections.Counter()
        self._short: dict[str, tuple[int, float]] = {}

    def settled(self, queue: str) -> None:
        """One of the worker's jobs of ``queue`` left its lease."""
        self._settled[queue] += 1

    def before_claim(self, queue: str) -> int:
        """The mark to hand ``after_claim``: what had settled when the claim was sent."""
        return self._settled[queue]

    def after_claim(self, queue: str, mark: int, sent_at: float, short: bool) -> None:
        if short:
            self._short[queue] = (mark, sent_at)
        else:
            self._short.pop(queue, None)

    def left_out(self, queue: str, now: float, holding: Callable[[], bool],
                 finishing: Callable[[], bool]) -> bool:
        """Whether to skip ``queue`` now: its last claim came back short, nothing of it has
        settled since that claim was sent, and ``holding()``: the worker still holds jobs of
        it (whose finishes wake it); and less than ``recheck_s`` has passed, or less than
        ``finishing_max_s`` and ``finishing()``: one of them is being finished (it settles
        soon)."""
        short = self._short.get(queue)
        if short is None:
            return False
        mark, sent_at = short
        waited_s = now - sent_at
        return self._settled[queue] == mark and holding() and (
            waited_s < self.recheck_s or (waited_s < self.finishing_max_s and finishing()))

    def until_recheck(self, now: float, finishing: Callable[[str], bool]) -> float:
        """Time until every queue left out is claimed from again whatever else happens (a
        queue whose ``finishing(queue)`` waits for that job to settle, which wakes the
        worker, up to ``finishing_max_s``)."""
        waits = [sent_at + (self.finishing_max_s if finishing(queue) else self.recheck_s) - now
                 for queue, (_, sent_at) in self._short.items()]
        return max(min((w for w in waits if w > 0), default=float("inf")), 0.0)
