"""Limits a claim obeys (docs/limits.md): per-key concurrency and a sliding-window rate.

Every store checks them inside the claim's transaction, under one lock per queue (SQLite's
``BEGIN IMMEDIATE``, a PostgreSQL row lock on the queue's limits row, a MongoDB write to the
queue's limits document that makes concurrent claims conflict), so N workers obey one limit.

The rate limit keeps, per queue, the store-clock timestamps of the last ``rate_per_s`` claims
(``recent``, oldest first). A claim at time ``t`` may take as many jobs as the log leaves room
for in ``(t − 1 s, t]``, and appends one timestamp per job it took. Stamps never go backwards
(``stamp``), so the admission rule gives the sliding guarantee: in ANY one-second window there
are at most ``rate_per_s`` claims. Proof: let ``T`` be the latest claim of a window
``[s, s + 1)``; every other claim in it has a stamp ``≥ s > T − 1`` and was admitted before
``T`` (stamps grow in admission order), so it is in the log at ``T`` — unless ``rate_per_s``
newer stamps pushed it out, all ``> T − 1`` too, and then ``T`` found no room. ``T``'s
admission counted them all and took at most what was left. In real time: a store clock that
reads milliseconds stamps a claim up to 1 ms early, so a claim at the very start of a real
window could carry a stamp just outside ``T``'s; admissions therefore count
``(t − 1 s − CLOCK_RESOLUTION_S, t]``, and the guarantee holds on the host's clock as well
(the conformance suite measures it there). A token bucket refilled at
``r``/s with capacity ``r`` admits up to ``2r`` in some windows; this log never does.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from leaseq.policy import check_limits

Ref = TypeVar("Ref", bound=Hashable)

#: The sliding window of ``rate_per_s``, in seconds.
WINDOW_S = 1.0
#: The coarsest clock a store stamps claims with (SQLite's and MongoDB's read milliseconds).
#: A stamp may be this much earlier than the claim it marks, so an admission counts the
#: stamps of a window this much longer: the guarantee then holds in real time too.
CLOCK_RESOLUTION_S = 0.001
#: How far back from a new stamp the stamps an admission counts reach.
COUNTED_S = WINDOW_S + CLOCK_RESOLUTION_S
#: How far past its first ``limit`` claimable jobs a key-limited claim looks for jobs
#: without a key (those behind a longer keyed backlog wait for the front to move). Every
#: claim of a key-limited queue reads these entries, so it stays small: give a large stream
#: of jobs without a key a queue of its own.
UNKEYED_SCAN = 20
#: A key-limited claim of ``limit`` jobs first reads the front of the claimable jobs, in claim
#: order: ``KEYED_WINDOW × limit + UNKEYED_SCAN`` of them (``window_size``). When the limits
#: let ``limit`` of those run, or the queue has no more ready jobs, that is the claim
#: (``first_within_key_limits``); only otherwise does it walk every key.
KEYED_WINDOW = 2
#: After a front that could not decide its claim, how many claims of that queue walk every key
#: straight away (``FrontFirst``).
FRONT_SKIPS = 8


@dataclass(frozen=True, slots=True)
class ClaimLimits:
    """The limits of one queue, as its policy gives them (None: not limited). Checked as the
    policy's are (``InvalidPolicy``): a store's ``claim`` may be called with limits built by
    hand, and a key limit of 0 or a fractional rate would otherwise reach its statements."""

    key_limit: int | None = None
    rate_per_s: int | None = None

    def __post_init__(self) -> None:
        check_limits(self.key_limit, self.rate_per_s)

    @property
    def any(self) -> bool:
        return self.key_limit is not None or self.rate_per_s is not None


NO_LIMITS = ClaimLimits()


@dataclass(frozen=True, slots=True)
class HeldBack:
    """Ready jobs a limit keeps from being claimed right now."""

    by_key: int = 0
    """Ready jobs beyond their key's free slots."""
    by_rate: int = 0
    """Ready jobs (not held by a key) beyond what the rate limit admits now."""

    @property
    def total(self) -> int:
        return self.by_key + self.by_rate


@dataclass(frozen=True, slots=True)
class LimitsState:
    """What a store keeps per limited queue, read under the claim's lock: the rate log, the
    limits its claims last ran with, and the store's clock (Unix seconds)."""

    recent: list[float]
    recorded: ClaimLimits
    now: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "recent", on_clock(self.recent, self.now))

    def at(self) -> float:
        """The stamp a claim made now is counted at."""
        return stamp(self.recent, self.now)


def on_clock(recent: Sequence[float], now: float) -> list[float]:
    """The rate log as the store's clock reads ``now``. A clock that reads before the newest
    stamp (a claim that waited on the lock carries an earlier reading; a clock stepped back,
    or another server's after a failover) moves every stamp back by the difference, so the
    newest is ``now``: the time since the last claim counts as none. That can only count
    more claims in the window, never fewer, so the limit holds; kept as they were, the stamps
    stood in the future and every later claim was stamped at the newest one, admitting
    ``rate_per_s`` claims in all until the clock caught up (an hour's step: an hour)."""
    if not recent or now >= recent[-1]:
        return list(recent)
    back = recent[-1] - now
    return [t - back for t in recent]


def stamp(recent: Sequence[float], now: float) -> float:
    """The time a claim is counted at: the store's clock, never before the last stamp (a
    transaction that waited on the lock may carry an earlier clock reading)."""
    return max(now, recent[-1]) if recent else now


def admit(recent: Sequence[float], at: float, want: int, rate_per_s: int) -> int:
    """How many of ``want`` claims may be stamped ``at`` (``at ≥`` every stamp in
    ``recent``): the room left in the window ``(at − 1 s, at]``."""
    in_window = sum(1 for t in recent if t > at - COUNTED_S)
    return max(0, min(want, rate_per_s - in_window))


def record(recent: Sequence[float], at: float, taken: int, rate_per_s: int) -> list[float]:
    """The log after ``taken`` claims stamped ``at``: the newest ``rate_per_s`` stamps, all
    an admission needs (see the module's proof). Stamps older than the window are dropped,
    but the newest one is always kept, so the next stamp never goes before it."""
    kept = [t for t in recent if t > at - COUNTED_S] + [at] * taken
    if not kept and recent:
        kept = [recent[-1]]
    return kept[-rate_per_s:]


def free_slots(key_limit: int, running: int) -> int:
    return max(0, key_limit - running)


def window_size(limit: int) -> int:
    """How many claimable jobs a key-limited claim of ``limit`` reads first (``KEYED_WINDOW``)."""
    return KEYED_WINDOW * limit + UNKEYED_SCAN


def first_within_key_limits(window: Sequence[tuple[Ref, str | None]], running: Mapping[str, int],
                            limit: int, key_limit: int, size: int) -> list[Ref] | None:
    """The claim a key-limited queue's front decides, or None when it cannot.

    ``window``: the first claimable jobs in claim order, as ``(ref, concurrency_key)``, at most
    ``size`` of them (fewer: the queue has no more); ``running``: each of their keys' jobs that
    are ``processing`` (a key left out runs none). Walking in claim order, a job without a key
    may always run, and a job with one may while its key's running jobs and those taken
    before it here stay under ``key_limit``: each key's first free-slots ready jobs, the set
    the walk of every key takes its best ``limit`` from. So the first ``limit`` jobs that may
    run are that walk's claim (or a better one: the walk looks for jobs without a key only
    ``UNKEYED_SCAN`` past ``limit``, the window further). When the window yields fewer
    and was full, jobs past it might still run (a key whose backlog sits behind a full
    key's): None, walk every key."""
    taken: dict[str, int] = {}
    chosen: list[Ref] = []
    for ref, key in window:
        if key is not None:
            held = running.get(key, 0) + taken.get(key, 0)
            if held >= key_limit:
                continue
            taken[key] = taken.get(key, 0) + 1
        chosen.append(ref)
        if len(chosen) == limit:
            return chosen
    return chosen if len(window) < size else None


class FrontFirst:
    """Whether a key-limited claim of a queue reads its front first. A front that could not
    decide (keys at their limit fill it: the limit binds, as when a worker asks for more jobs
    than its keys have slots) was read for nothing, and the next claims would most likely
    find the same, so the next ``FRONT_SKIPS`` claims of that queue walk every key at once;
    then the front is tried again. Only a cost: either way the claim takes the same jobs. A
    store's threads share one; a lost update only moves when the front is next tried."""

    def __init__(self) -> None:
        self._skips: dict[str, int] = {}

    def worth_reading(self, queue: str) -> bool:
        left = self._skips.get(queue, 0)
        if left:
            self._skips[queue] = left - 1
            return False
        return True

    def decide(self, queue: str, window: Sequence[tuple[Ref, str | None]],
               running: Mapping[str, int], limit: int, key_limit: int,
               size: int) -> list[Ref] | None:
        """``first_within_key_limits`` of the queue's front; when it cannot decide, the next
        ``FRONT_SKIPS`` claims of the queue skip the front."""
        chosen = first_within_key_limits(window, running, limit, key_limit, size)
        if chosen is None:
            self._skips[queue] = FRONT_SKIPS
        return chosen


def key_backlog(ready_and_running: Sequence[tuple[int, int]], key_limit: int) -> int:
    """Ready jobs held by key limits: per key ``(ready, running)``, the ready beyond the
    key's free slots."""
    return sum(max(0, ready - free_slots(key_limit, running))
               for ready, running in ready_and_running)


def held_back(ready: int, by_key: int, limits: ClaimLimits) -> HeldBack:
    """What the limits hold back of ``ready`` claimable jobs, ``by_key`` of them by keys: by
    the rate, of the rest those beyond one second's claims (``rate_per_s``). Not the room
    left in the current window: that is 0 for most of every second of a busy queue, and an
    autoscaler reading it would see no work while a backlog waits."""
    if limits.rate_per_s is None:
        return HeldBack(by_key, 0)
    return HeldBack(by_key, max(0, ready - by_key - limits.rate_per_s))
