"""How far ahead of its free slots a worker may claim, so that one claim takes a big batch.

A prefetched job is under lease and counted in flight, but waits for a slot. That is only worth
it when a slot will free soon, so the allowance is what the worker's handlers have just shown
they get through: as many jobs as finished within the last ``wait_s`` (at most ``limit``).
Handlers that finish thousands of jobs a second earn the whole ``limit``; long handlers earn
nothing, and the worker claims only its free slots. This is what keeps prefetch out of the
trap of a prefetching broker, where one busy worker sits on jobs that another could start now.

The backstop is the worker's: a prefetched job that has not started within ``wait_s`` is given
back at once (free, not counted as a give-back), and ``reset`` then forgets the history, so the
worker claims only free slots until its handlers finish jobs again.
"""

from __future__ import annotations

from collections import deque


class Prefetch:
    def __init__(self, limit: int, wait_s: float):
        self.limit = limit
        """Most jobs claimed ahead of free slots; 0 turns prefetch off."""
        self.wait_s = wait_s
        """How long a prefetched job may wait for a slot; also the window of the history."""
        self._finished_at: deque[float] = deque(maxlen=max(limit, 1))

    def finished(self, now: float) -> None:
        """A handler finished a job (thread-safe: a deque append)."""
        if self.limit:
            self._finished_at.append(now)

    def allowance(self, now: float) -> int:
        """Jobs that may be claimed beyond the free slots now. Call from one thread only."""
        history = self._finished_at
        while history and history[0] < now - self.wait_s:
            history.popleft()
        return min(len(history), self.limit)

    def reset(self) -> None:
        """A prefetched job waited too long: claim only free slots until jobs finish again."""
        self._finished_at.clear()
