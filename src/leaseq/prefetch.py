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
