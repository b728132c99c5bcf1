"""The admission logic of the claim limits (leaseq.limits), as properties: whatever the order,
timing and size of the claims, no one-second window ever holds more than ``rate_per_s`` of
them, and a claim is never refused room that the window has. A token bucket, the usual rate
limiter, fails the first property (shown below); the log of recent stamps meets it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leaseq.errors import InvalidPolicy
from leaseq.limits import (
    COUNTED_S,
    FRONT_SKIPS,
    WINDOW_S,
    ClaimLimits,
    FrontFirst,
    HeldBack,
    admit,
    first_within_key_limits,
    held_back,
    key_backlog,
    on_clock,
    record,
    stamp,
    window_size,
)
from leaseq.stores.sqlite.store import SQLiteStore

#: A claim: how long after the previous one it reads the clock (clock readings may go back a
#: little: a claim that waited on the lock read it before the one that held the lock), and
#: how many jobs it asks for.
claims = st.lists(st.tuples(st.floats(-0.05, 0.7, allow_nan=False), st.integers(1, 12)),
                  max_size=120)
rates = st.integers(1, 30)


def run(rate: int, asks: list[tuple[float, int]]) -> list[float]:
    """Every admitted claim's stamp, one per job, claims made in the order given."""
    clock, recent, stamps = 0.0, [], []
    for step, want in asks:
        clock += step
        at = stamp(recent, clock)
        room = admit(recent, at, want, rate)
        assert 0 <= room <= want
        recent = record(recent, at, room, rate)
        stamps += [at] * room
    return stamps


def most_in_a_window(stamps: list[float]) -> int:
    """The most stamps in any window [s, s + 1 s): the worst one starts at a stamp."""
    return max((sum(1 for t in stamps if s <= t < s + WINDOW_S) for s in stamps), default=0)


@settings(max_examples=400, deadline=None)
@given(rate=rates, asks=claims)
def test_no_sliding_window_holds_more_than_the_rate(rate: int, asks: list[tuple[float, int]]
                                                    ) -> None:
    assert most_in_a_window(run(rate, asks)) <= rate


@settings(max_examples=300, deadline=None)
@given(rate=rates, asks=claims)
def test_a_claim_gets_all_the_room_its_window_has(rate: int, asks: list[tuple[float, int]]
                                                  ) -> None:
    # Liveness: what a claim is refused is exactly what the last second already used
    clock, recent, stamps = 0.0, [], []
    for step, want in asks:
        clock += step
        at = stamp(recent, clock)
        used = sum(1 for t in stamps if t > at - COUNTED_S)
        room = admit(recent, at, want, rate)
        assert room == min(want, rate - used)
        recent = record(recent, at, room, rate)
        stamps += [at] * room


#: Claims on a millisecond grid, some exactly one second apart: where a clock that reads
#: milliseconds puts a stamp up to 1 ms before its claim.
ms_claims = st.lists(st.tuples(st.sampled_from([0.0, 0.0004, 0.0009, 0.2, 0.5, 0.9995, 1.0]),
                               st.integers(1, 12)), max_size=120)


@settings(max_examples=400, deadline=None)
@given(rate=rates, asks=ms_claims)
def test_a_millisecond_clock_keeps_the_rate_in_real_time(rate: int,
                                                          asks: list[tuple[float, int]]) -> None:
    # Given a store clock that truncates to milliseconds, each claim made at a real instant
    clock, recent, real = 0.0, [], []
    for step, want in asks:
        clock += step
        at = stamp(recent, int(clock * 1000) / 1000)
        room = admit(recent, at, want, rate)
        recent = record(recent, at, room, rate)
        real += [clock] * room
    # Then no real one-second window holds more than the rate either
    assert most_in_a_window(real) <= rate


@settings(max_examples=200, deadline=None)
@given(rate=rates, asks=claims)
def test_stamps_never_go_back_and_the_log_stays_bounded(rate: int,
                                                        asks: list[tuple[float, int]]) -> None:
    clock, recent, last = 0.0, [], float("-inf")
    for step, want in asks:
        clock += step
        at = stamp(recent, clock)
        room = admit(recent, at, want, rate)
        if room:  # an admitted claim is never stamped before one admitted earlier
            assert at >= last
            last = at
        recent = record(recent, at, room, rate)
        assert len(recent) <= rate and recent == sorted(recent)


def token_bucket(rate: int, asks: list[tuple[float, int]]) -> list[float]:
    """A bucket of ``rate`` tokens refilled at ``rate`` a second: what the log replaces."""
    clock, tokens, last, stamps = 0.0, float(rate), 0.0, []
    for step, want in asks:
        clock += step
        tokens = min(rate, tokens + (clock - last) * rate)
        last = clock
        took = min(want, int(tokens))
        tokens -= took
        stamps += [clock] * took
    return stamps


def test_a_token_bucket_breaks_the_sliding_guarantee_the_log_keeps() -> None:
    # Given a full bucket emptied at once, then refilled for just under a second
    asks = [(0.0, 20), (0.99, 20)]
    # Then the bucket admits nearly twice the rate within one second; the log does not
    assert most_in_a_window(token_bucket(20, asks)) == 39
    assert most_in_a_window(run(20, asks)) == 20


def test_a_late_clock_reading_is_stamped_after_the_last_claim() -> None:
    assert stamp([10.0, 10.5], 10.2) == 10.5
    assert stamp([], 3.0) == 3.0


def test_held_back_splits_the_ready_jobs_between_keys_and_rate() -> None:
    # 10 ready: per key (ready, running) with key_limit 2 → 3 and 0 held by keys
    by_key = key_backlog([(4, 1), (2, 0)], 2)
    assert by_key == 3
    # Of the other 7, a rate of 5 a second holds back 2, wherever the window stands (its room
    # now would be 0 for most of every second of a busy queue)
    assert held_back(10, by_key, ClaimLimits(2, 5)) == HeldBack(3, 2)
    assert held_back(10, by_key, ClaimLimits(key_limit=2)) == HeldBack(3, 0)
    assert held_back(4, 0, ClaimLimits(rate_per_s=5)) == HeldBack(0, 0)
    assert HeldBack(3, 2).total == 5


@pytest.mark.parametrize("limits, any_", [(ClaimLimits(), False), (ClaimLimits(1), True),
                                          (ClaimLimits(rate_per_s=3), True)])
def test_claim_limits_say_whether_there_are_any(limits: ClaimLimits, any_: bool) -> None:
    assert limits.any is any_


# --- the key-limited claim's front (first_within_key_limits) ----------------------------------

#: A queue's ready jobs in claim order, each with its key (None: no key), over a few keys.
ready_keys = st.lists(st.sampled_from([None, "a", "b", "c", "d"]), max_size=60)
running_counts = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 4))


def claim_by_key_walk(keys: list[str | None], running: dict[str, int], limit: int,
                      key_limit: int) -> list[int]:
    """What the walk of every key claims (``claim_keyed``): each key's first free-slots ready
    jobs and the jobs without a key, the best ``limit`` of them (here looking for jobs without
    a key through the whole queue; the statement stops ``UNKEYED_SCAN`` past ``limit``)."""
    free = {key: max(0, key_limit - running.get(key, 0)) for key in set(keys) - {None}}
    seen: dict[str, int] = {}
    candidates = []
    for position, key in enumerate(keys):
        if key is None:
            candidates.append(position)
        else:
            seen[key] = seen.get(key, 0) + 1
            if seen[key] <= free[key]:
                candidates.append(position)
    return candidates[:limit]


@settings(max_examples=400, deadline=None)
@given(ready_keys, running_counts, st.integers(1, 12), st.integers(1, 4), st.integers(1, 40))
def test_the_front_decides_the_claim_the_key_walk_would_make(
        keys: list[str | None], running: dict[str, int], limit: int, key_limit: int,
        size: int) -> None:
    # Given a queue's ready jobs in claim order and the front a claim reads (`size` of them)
    window = [(position, key) for position, key in enumerate(keys)][:size]
    # When the claim decides from that front
    chosen = first_within_key_limits(window, running, limit, key_limit, size)
    # Then it takes what the walk of every key takes, or it leaves the claim to that walk
    # only when the front was full and the limits let fewer than `limit` of it run
    if chosen is None:
        assert len(window) == size
    else:
        assert chosen == claim_by_key_walk(keys, running, limit, key_limit)


def test_a_full_key_at_the_front_leaves_the_claim_to_the_key_walk() -> None:
    # Given a front of jobs of one key that is at its limit, and jobs of another behind it
    keys: list[str | None] = ["hot"] * 30 + ["cold"] * 3
    window = list(enumerate(keys))[:window_size(5)]
    # When a claim of 5 decides from that front, then it cannot: the key walk must look
    assert window_size(5) == 30
    assert first_within_key_limits(window, {"hot": 2}, 5, 2, window_size(5)) is None
    # And a front that holds the whole queue decides however few run
    assert first_within_key_limits(list(enumerate(keys)), {"hot": 2}, 5, 2, 40) == [30, 31]


def test_after_a_front_that_could_not_decide_the_next_claims_walk_every_key() -> None:
    # Given a queue whose front could not decide a claim, and another queue
    front = FrontFirst()
    assert front.worth_reading("bound")
    assert front.decide("bound", [(0, "k"), (1, "k")], {"k": 2}, 2, 2, 2) is None
    # Then the next FRONT_SKIPS claims of it skip the front, and then it is tried again
    assert [front.worth_reading("bound") for _ in range(FRONT_SKIPS + 1)] == (
        [False] * FRONT_SKIPS + [True])
    # And the other queue reads its front all along
    assert front.worth_reading("other")


def test_a_clock_stepped_back_moves_the_rate_log_back_with_it() -> None:
    # Given a log whose newest stamps stand an hour ahead of the store's clock
    log = [3600.0, 3600.5]
    # When it is read at 0 (the clock corrected), Then the newest stamp is now and the
    # spacing is kept, so the window still counts both claims
    assert on_clock(log, 0.0) == [-0.5, 0.0]
    assert admit(on_clock(log, 0.0), 0.0, 5, 5) == 3
    # And a clock at or past the newest stamp leaves the log as it is
    assert on_clock(log, 3601.0) == log


def test_a_rate_limited_queue_keeps_its_rate_after_the_store_clock_steps_back(
        tmp_path: Path) -> None:
    # Given one claim stamped by a clock an hour ahead, then the clock corrected
    path = str(tmp_path / "jobs.db")
    ahead = SQLiteStore(path, time_offset_s=3600.0)
    corrected = SQLiteStore(path)
    two_s_later = SQLiteStore(path, time_offset_s=2.0)
    try:
        queue = corrected.queue("api", rate_per_s=5)
        queue.enqueue_many([queue.spec(f"j{i}", {"i": i}) for i in range(20)])
        assert len(ahead.queue("api", rate_per_s=5).claim("w-ahead", 1)) == 1
        # When claims go on by the corrected clock, now and two seconds later
        now = queue.claim("w", 5)
        later = two_s_later.queue("api", rate_per_s=5).claim("w", 5)
        # Then the window holds the last claim as just made (4 more now), and two seconds on
        # the rate admits 5 again: the queue is not held for the hour the clock stepped
        assert (len(now), len(later)) == (4, 5)
    finally:
        for store in (ahead, corrected, two_s_later):
            store.close()


@pytest.mark.parametrize("limits", [{"key_limit": 0}, {"key_limit": True}, {"key_limit": "2"},
                                    {"rate_per_s": 1.5}, {"rate_per_s": -1},
                                    {"rate_per_s": 10_001}])
def test_limits_built_by_hand_are_checked_as_a_policys_are(limits: dict[str, object]) -> None:
    # A store's claim may be given ClaimLimits built by hand: a key limit of 0 or a
    # fractional rate is refused here, as QueuePolicy refuses it, not deep in a statement
    with pytest.raises(InvalidPolicy, match=next(iter(limits))):
        ClaimLimits(**limits)  # type: ignore[arg-type]
