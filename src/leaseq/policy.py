"""Queue policy: attempts, lease, heartbeat, backoff and the snooze and give-back bounds,
with their defaults."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from leaseq.errors import InvalidPolicy
from leaseq.validate import MAX_DELAY_S

#: The highest ``rate_per_s``: the store keeps one timestamp per claim of the last second.
MAX_RATE_PER_S = 10_000
#: A retry's delay is its backoff times a jitter of up to this much.
MAX_JITTER = 1.5


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """How one queue (or one task) treats its jobs. Validated when built; unknown keys raise."""

    max_attempts: int = 5
    """Claims a job may have before it is quarantined. Defaults to 5."""
    lease_s: float = 900.0
    """How long a claim owns the job without a heartbeat. Defaults to 900 s."""
    heartbeat_every_s: float | None = None
    """How often the worker extends the lease. Defaults to lease_s / 3."""
    backoff_base_s: float = 60.0
    """First retry delay before jitter. Defaults to 60 s."""
    backoff_cap_s: float = 3600.0
    """Longest retry delay before jitter. Defaults to 3,600 s."""
    max_payload_bytes: int = 1_048_576
    """Largest payload (and result), as canonical JSON in UTF-8. Defaults to 1 MiB; at most
    1 GiB, or what the queue's store holds (``Store.max_value_bytes``: 16 MiB on MongoDB)."""
    snooze_s: float = 5.0
    """Delay of a ``Snooze()`` raised without one. Defaults to 5 s: a condition that has not
    cleared is not looked at again at once (an explicit ``Snooze(0)`` still is)."""
    max_snoozes: int = 200
    """Snoozes a job may have; the next one quarantines it as ``failed(exhausted)``, so a
    condition that never clears cannot keep it alive for ever. Defaults to 200."""
    max_givebacks: int = 3
    """Times a job may be given back *while its handler ran* (a worker stopped before it
    finished) with its attempt refunded; after that each give-back spends the attempt, so a
    job that outlives every grace period still ends. A handler that never started is always
    given back free. Defaults to 3."""
    key_limit: int | None = None
    """At most this many jobs with the same ``concurrency_key`` are processing at once,
    across every worker; checked in the claim (docs/limits.md). Defaults to None: keys are
    not limited. Every handle on a queue must carry the same limits."""
    rate_per_s: int | None = None
    """At most this many claims in any sliding one-second window of the store's clock,
    across every worker; checked in the claim (docs/limits.md). Defaults to None: no rate
    limit."""

    def __post_init__(self) -> None:
        _check_int(self.max_attempts, "max_attempts", 1, 1_000_000)
        _check_number(self.lease_s, "lease_s", 0.001)
        _check_number(self.backoff_base_s, "backoff_base_s", 0.0)
        # with its jitter, every delay the cap allows is one a retry may be written with
        _check_number(self.backoff_cap_s, "backoff_cap_s", 0.0, MAX_DELAY_S / MAX_JITTER)
        _check_int(self.max_payload_bytes, "max_payload_bytes", 2, 1 << 30)
        _check_number(self.snooze_s, "snooze_s", 0.0)
        _check_int(self.max_snoozes, "max_snoozes", 0, 1_000_000)
        _check_int(self.max_givebacks, "max_givebacks", 0, 1_000_000)
        check_limits(self.key_limit, self.rate_per_s)
        every_s = self.heartbeat_every_s
        if every_s is None:
            every_s = self.lease_s / 3
            object.__setattr__(self, "heartbeat_every_s", every_s)
        _check_number(every_s, "heartbeat_every_s", 0.001)
        if every_s >= self.lease_s:
            raise InvalidPolicy(
                f"heartbeat_every_s ({every_s}) must be shorter than "
                f"lease_s ({self.lease_s}), or every lease would lapse between beats"
            )

    @classmethod
    def build(cls, base: QueuePolicy | None = None, **options: Any) -> QueuePolicy:
        """A policy from keyword options; unknown keys raise ``InvalidPolicy``."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InvalidPolicy(
                f"unknown queue policy option(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        base = base or cls()
        if "lease_s" in options and "heartbeat_every_s" not in options:
            options["heartbeat_every_s"] = None  # follow the new lease
        return replace(base, **options)

    def as_dict(self) -> Mapping[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def backoff_s(self, attempts: int, rng: random.Random | None = None) -> float:
        """Delay before the next try after ``attempts`` claims (1 = after the first)."""
        return backoff_s(attempts, self.backoff_base_s, self.backoff_cap_s, rng)


def backoff_s(
    attempts: int, base_s: float, cap_s: float, rng: random.Random | None = None
) -> float:
    """``min(base · 2^(attempts−1), cap) · uniform(1.0, 1.5)``; the jitter spreads retries."""
    exponent = max(attempts, 1) - 1
    try:
        raw = min(math.ldexp(base_s, exponent), cap_s)
    except OverflowError:  # base · 2^exponent is past any float: the cap has long won
        raw = cap_s
    return raw * (rng or random).uniform(1.0, MAX_JITTER)


def _check_number(value: Any, name: str, minimum: float, maximum: float = MAX_DELAY_S) -> None:
    """A duration of the policy: from ``minimum`` to ``maximum`` (ten years: the longest
    delay a store takes) seconds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidPolicy(f"{name} must be a number of seconds, got {type(value).__name__}")
    # compared, not converted: math.isfinite(10**400) raises OverflowError
    if value != value or abs(value) == math.inf or value < minimum:
        raise InvalidPolicy(f"{name} must be a finite number ≥ {minimum}, got {value!r}")
    if value > maximum:
        raise InvalidPolicy(f"{name} may be at most {maximum:.0f} s, got {str(value)[:40]}")


def check_limits(key_limit: Any, rate_per_s: Any) -> None:
    """A queue's limits (``QueuePolicy``, ``ClaimLimits``): each None, or a whole number in
    its range; else ``InvalidPolicy``."""
    if key_limit is not None:
        _check_int(key_limit, "key_limit", 1, 1_000_000)
    if rate_per_s is not None:
        _check_int(rate_per_s, "rate_per_s", 1, MAX_RATE_PER_S)


def _check_int(value: Any, name: str, minimum: int, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidPolicy(f"{name} must be a whole number, got {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise InvalidPolicy(f"{name} must be between {minimum} and {maximum}, got {value}")
