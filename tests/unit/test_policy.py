"""QueuePolicy: defaults, validation, unknown keys, and the backoff's bounds."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

import leaseq
from leaseq import validate
from leaseq.errors import InvalidInput, InvalidPolicy
from leaseq.policy import QueuePolicy, backoff_s


def bounds(attempts: int, base_s: float, cap_s: float) -> tuple[float, float]:
    """The band DESIGN.md §3 promises: min(base·2^(n−1), cap)·[1.0, 1.5]."""
    try:
        raw = min(math.ldexp(base_s, max(attempts, 1) - 1), cap_s)
    except OverflowError:  # base·2^(n−1) is past any float, so past the cap
        raw = cap_s
    return raw, 1.5 * raw


def test_defaults_are_the_documented_ones() -> None:
    policy = QueuePolicy()
    assert (policy.max_attempts, policy.lease_s, policy.heartbeat_every_s) == (5, 900.0, 300.0)
    assert (policy.backoff_base_s, policy.backoff_cap_s) == (60.0, 3600.0)
    assert (policy.snooze_s, policy.max_snoozes, policy.max_givebacks) == (5.0, 200, 3)


def test_snooze_and_give_back_bounds_may_be_zero() -> None:
    # Snooze(0) semantics for every bare Snooze(); no snooze allowed; no free give-back.
    policy = QueuePolicy.build(snooze_s=0, max_snoozes=0, max_givebacks=0)
    assert (policy.snooze_s, policy.max_snoozes, policy.max_givebacks) == (0, 0, 0)


def test_heartbeat_follows_a_new_lease_unless_given() -> None:
    assert QueuePolicy.build(lease_s=60).heartbeat_every_s == 20
    assert QueuePolicy.build(lease_s=60, heartbeat_every_s=5).heartbeat_every_s == 5
    # Built on a base: the new lease still drags the derived heartbeat along.
    assert QueuePolicy.build(QueuePolicy(lease_s=900), lease_s=90).heartbeat_every_s == 30


def test_unknown_key_is_refused_and_known_keys_named() -> None:
    with pytest.raises(InvalidPolicy) as raised:
        QueuePolicy.build(max_attempt=3)
    assert "max_attempt" in str(raised.value) and "max_attempts" in str(raised.value)
    assert isinstance(raised.value, InvalidInput)


@pytest.mark.parametrize(
    "options",
    [
        {"max_attempts": 0},
        {"max_attempts": True},
        {"max_attempts": 2.5},
        {"lease_s": 0},
        {"lease_s": float("nan")},
        {"lease_s": float("inf")},
        {"lease_s": "900"},
        {"backoff_base_s": -1},
        {"backoff_cap_s": float("-inf")},
        # with its jitter (up to 1.5 times), a cap past 6.67 years would write a delay past
        # the ten years a store takes: the retry's write would fail, the job stay processing
        {"backoff_cap_s": 7 * 365 * 86400},
        {"lease_s": 11 * 365 * 86400},
        {"lease_s": 10**400},  # no float: math.isfinite raised OverflowError
        {"snooze_s": 11 * 365 * 86400},
        {"lease_s": 60, "heartbeat_every_s": 60},
        {"max_payload_bytes": 1},
        {"snooze_s": -1},
        {"snooze_s": float("nan")},
        {"max_snoozes": -1},
        {"max_snoozes": 1.5},
        {"max_givebacks": -1},
        {"max_givebacks": None},
    ],
    ids=repr,
)
def test_out_of_range_values_are_refused_when_built(options: dict[str, object]) -> None:
    with pytest.raises(InvalidPolicy):
        QueuePolicy.build(**options)  # type: ignore[arg-type]


def test_the_longest_cap_still_writes_a_retry_a_store_takes() -> None:
    longest = validate.MAX_DELAY_S / 1.5
    policy = QueuePolicy(backoff_base_s=longest, backoff_cap_s=longest)
    for seed in range(50):
        assert validate.delay_s(policy.backoff_s(1, random.Random(seed))) <= validate.MAX_DELAY_S


def test_policy_is_frozen() -> None:
    policy = QueuePolicy()
    with pytest.raises(AttributeError):
        policy.max_attempts = 9  # type: ignore[misc]


@pytest.mark.parametrize("attempts", range(1, 12))
def test_backoff_with_seeded_rng_stays_in_band(attempts: int) -> None:
    rng = random.Random(attempts)
    low, high = bounds(attempts, 60.0, 3600.0)
    delays = [backoff_s(attempts, 60.0, 3600.0, rng) for _ in range(200)]
    assert all(low <= d <= high for d in delays)
    # The jitter spreads: not every retry of a burst lands on the same second.
    assert max(delays) - min(delays) > 0.2 * (high - low)


def test_backoff_is_reproducible_with_the_same_seed() -> None:
    first = [backoff_s(n, 60, 3600, random.Random(7)) for n in range(1, 8)]
    assert first == [backoff_s(n, 60, 3600, random.Random(7)) for n in range(1, 8)]


def test_backoff_examples() -> None:
    rng = random.Random(1)
    assert 60 <= QueuePolicy().backoff_s(1, rng) <= 90
    assert 120 <= QueuePolicy().backoff_s(2, rng) <= 180
    assert 3600 <= QueuePolicy().backoff_s(30, rng) <= 5400  # capped
    assert 60 <= QueuePolicy().backoff_s(0, rng) <= 90  # before any claim: as the first


def test_backoff_survives_a_huge_attempt_count() -> None:
    assert 3600 <= backoff_s(1_000_000, 60, 3600, random.Random(3)) <= 5400


def test_zero_base_backoff_stays_zero_after_many_attempts() -> None:
    # min(0·2^(n−1), cap) is 0 for every n: "retry at once" must not turn into the cap.
    assert backoff_s(100, 0.0, 3600.0, random.Random(5)) == 0.0


@given(
    attempts=st.integers(min_value=0, max_value=1_000_000),
    base_s=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    cap_s=st.floats(min_value=0, max_value=1e7, allow_nan=False),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_backoff_property_always_in_band(
    attempts: int, base_s: float, cap_s: float, seed: int
) -> None:
    low, high = bounds(attempts, base_s, cap_s)
    delay = backoff_s(attempts, base_s, cap_s, random.Random(seed))
    assert low <= delay <= high
    assert delay <= 1.5 * cap_s


@given(st.integers(min_value=1, max_value=60))
def test_backoff_never_shrinks_as_attempts_grow(attempts: int) -> None:
    low_now, _ = bounds(attempts, 60, 3600)
    low_next, _ = bounds(attempts + 1, 60, 3600)
    assert low_now <= low_next
    # Lowest jitter of the next attempt never undercuts the lowest of this one.
    assert backoff_s(attempts + 1, 60, 3600, _LowestJitter()) >= low_now


class _LowestJitter(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return a


@pytest.mark.parametrize("queues, attempts", [(5, 5.0), (1, True)], ids=repr)
def test_a_jobs_max_attempts_equal_to_the_queues_is_still_type_checked(
        queues: int, attempts: object) -> None:
    # A float or a bool equal to the queue's own was stored as given (and a PostgreSQL batch
    # then failed on its "5.0" with a raw driver error)
    queue = leaseq.connect("sqlite:///:memory:").queue("q", max_attempts=queues)
    with pytest.raises(InvalidPolicy, match="whole number"):
        queue.spec("a", {}, max_attempts=attempts)  # type: ignore[arg-type]
