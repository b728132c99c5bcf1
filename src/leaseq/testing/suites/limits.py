"""Limits in the claim (docs/limits.md): priority order, per-key concurrency and the sliding
rate, each held across threads and processes because the store enforces it in the claim.

A store whose ``supports_claim_limits`` is False has the key and rate tests skipped, with the
reason; priorities are ordinary claim order and are tested on every store.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import pytest

from leaseq.errors import InvalidPolicy
from leaseq.limits import ClaimLimits, HeldBack
from leaseq.stores import connect
from leaseq.testing.harness import (
    LONG_LEASE_S,
    W1,
    W2,
    FreshStore,
    advance,
    advance_past,
    must_get,
    run_processes,
)

KEY_JOBS, KEYS, KEY_LIMIT = 1000, 10, 2
RATE, RATE_RUN_S = 20, 3.0
#: How long a handler holds its job: long enough that claims of one key overlap.
HOLD_S = 0.002


def _block_key(i: int) -> str:
    return f"key-{i * KEYS // KEY_JOBS}"


def _needs_limits(fresh: FreshStore) -> None:
    if not fresh.store.supports_claim_limits:
        pytest.skip("store has no claim limits (supports_claim_limits is False)")


def max_running_per_key(spans: Iterable[tuple[str, float, float]]) -> dict[str, int]:
    """The most jobs of each key running at one instant, from ``(key, start, stop)`` spans of
    one clock. A stop at the same instant as a start frees its slot first."""
    events: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for key, start, stop in spans:
        events[key] += [(start, 1), (stop, -1)]
    peak: dict[str, int] = {}
    for key, points in events.items():
        running = top = 0
        for _, step in sorted(points):
            running += step
            top = max(top, running)
        peak[key] = top
    return peak


def max_in_any_window(intervals: Iterable[tuple[float, float]], window_s: float = 1.0) -> int:
    """The most claims surely inside one window: a claim, taken at some instant between the
    call (``a``) and its return (``b``), is counted in ``[s, s + window_s)`` only when all of
    ``[a, b]`` is. A lower bound of the true count, so a count above the limit is a breach."""
    spans = sorted(intervals)
    return max((sum(1 for a, b in spans if s <= a and b < s + window_s) for s, _ in spans),
               default=0)


def _run_keyed(q: Any, worker_id: str, deadline: float) -> list[tuple[str, float, float]]:
    """Claim, hold, finish until nothing is left: a ``(key, start, stop)`` span per job, on
    the host's monotonic clock (one clock for every process of the host)."""
    spans: list[tuple[str, float, float]] = []
    while time.monotonic() < deadline:
        jobs = q.claim(worker_id, limit=2, lease_s=LONG_LEASE_S)
        if not jobs:
            if not q.counts().get("pending"):
                break  # the rest is running elsewhere: nothing ever comes back here
            time.sleep(0.002)  # every slot is taken: wait for a finish
            continue
        for job in jobs:
            start = time.monotonic()
            time.sleep(HOLD_S)
            stop = time.monotonic()
            spans.append((job.concurrency_key, start, stop))
            q.complete(job)
    return spans


def _keyed_threads(q: Any, name: str, threads: int) -> list[tuple[str, float, float]]:
    deadline = time.monotonic() + 120
    out: list[list[tuple[str, float, float]]] = [[] for _ in range(threads)]

    def work(i: int) -> None:
        out[i] = _run_keyed(q, f"{name}-t{i}", deadline)

    runners = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for runner in runners:
        runner.start()
    for runner in runners:
        runner.join()
    return [span for spans in out for span in spans]


def _keyed_process(url: str, options: dict[str, Any], queue: str, barrier: Any,
                   name: str) -> list[tuple[str, float, float]]:
    store = connect(url, **options)
    try:
        q = store.queue(queue, key_limit=KEY_LIMIT)
        barrier.wait(timeout=60)
        return _keyed_threads(q, name, threads=2)
    finally:
        store.close()


def _rated_process(url: str, options: dict[str, Any], queue: str, barrier: Any,
                   name: str) -> list[tuple[float, float]]:
    """Claim as fast as allowed for ``RATE_RUN_S``: per job, the wall-clock instants before
    the claim call and after its return (the store's clock is the host's)."""
    store = connect(url, **options)
    try:
        q = store.queue(queue, rate_per_s=RATE)
        barrier.wait(timeout=60)
        end, taken = time.time() + RATE_RUN_S, []
        while time.time() < end:
            before = time.time()
            jobs = q.claim(name, limit=5, lease_s=LONG_LEASE_S)
            after = time.time()
            taken += [(before, after)] * len(jobs)
        return taken
    finally:
        store.close()


def _hold_one_and_wait(url: str, options: dict[str, Any], queue: str, out: Any) -> None:
    """Claim one job of the queue (short lease) and hang until killed."""
    store = connect(url, **options)
    (job,) = store.queue(queue, key_limit=1).claim("doomed-worker", lease_s=1.0)
    out.put(job.id)
    time.sleep(600)


class LimitsSuite:
    # --- priority ------------------------------------------------------------------------

    def test_higher_priority_is_claimed_first_then_not_before_then_id(
        self, leaseq_store: FreshStore
    ) -> None:
        # Given jobs of three priorities, enqueued out of order, two with the same priority
        # and id order different from their not-before order
        q = leaseq_store.queue()
        q.enqueue("low", {}, priority=-5)
        q.enqueue("b-mid", {}, priority=3)
        q.enqueue("a-mid", {}, priority=3, delay_s=0.001)
        q.enqueue("plain", {})
        q.enqueue("top", {}, priority=10)
        advance(leaseq_store.store, 1)
        # When they are claimed one at a time
        order = [q.claim(W1)[0].id for _ in range(5)]
        # Then the highest priority first; equal priorities in not-before order
        assert order == ["top", "b-mid", "a-mid", "plain", "low"]

    def test_a_new_revision_may_change_the_priority(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        q.enqueue("a", {}, revision="1")
        q.enqueue("b", {}, revision="1", priority=1)
        q.enqueue("a", {}, revision="2", priority=9)
        assert must_get(q, "a").priority == 9
        assert [q.claim(W1)[0].id for _ in range(2)] == ["a", "b"]

    def test_a_job_keeps_its_priority_and_key_through_retries(
        self, leaseq_store: FreshStore
    ) -> None:
        q = leaseq_store.queue()
        q.enqueue("a", {}, priority=4, concurrency_key="tenant:1")
        (job,) = q.claim(W1)
        assert (job.priority, job.concurrency_key) == (4, "tenant:1")
        q.retry_later(job, "boom", delay_s=0)
        again = must_get(q, "a")
        assert (again.priority, again.concurrency_key) == (4, "tenant:1")

    # --- key limits ----------------------------------------------------------------------

    def test_a_key_runs_at_most_key_limit_jobs_and_other_keys_go_on(
        self, leaseq_store: FreshStore
    ) -> None:
        _needs_limits(leaseq_store)
        # Given 3 jobs of tenant a, 1 of tenant b, 1 without a key; key_limit 2
        q = leaseq_store.queue(key_limit=2)
        for i in range(3):
            q.enqueue(f"a{i}", {}, concurrency_key="a")
        q.enqueue("b0", {}, concurrency_key="b")
        q.enqueue("free", {})
        # When a worker asks for 10
        taken = sorted(j.id for j in q.claim(W1, limit=10))
        # Then a's third job waits, ready, held back by its key
        assert taken == ["a0", "a1", "b0", "free"]
        assert q.claim(W2, limit=10) == []
        assert must_get(q, "a2").status == "pending"
        assert q.held_back() == HeldBack(by_key=1, by_rate=0)
        # And a finish frees the slot
        q.complete(must_get(q, "a0"))
        assert [j.id for j in q.claim(W2, limit=10)] == ["a2"]
        assert q.held_back() == HeldBack()

    @pytest.mark.parametrize("back", ["finish", "lapse", "lapse-claim-one", "reclaim"])
    def test_a_revision_that_arrives_while_its_job_runs_moves_it_to_the_new_key(
        self, leaseq_store: FreshStore, back: str
    ) -> None:
        _needs_limits(leaseq_store)
        # Given key_limit 2; "a" running under key "old" (a slot to spare there), "n1" and "n2"
        # running under key "new" (full) and 60 more of "new" waiting (more than a claim's
        # look at the queue's front, so the claim walks the keys)
        q = leaseq_store.queue(key_limit=2)
        q.enqueue("a", {"v": 1}, revision="1", concurrency_key="old")
        q.enqueue_many([q.spec(f"n{i}", {}, concurrency_key="new") for i in range(1, 63)])
        first = q.claim_one("a", W1, lease_s=60)
        running_new = [q.claim_one(n, W2, lease_s=LONG_LEASE_S) for n in ("n1", "n2")]
        assert first is not None and None not in running_new
        # When a new revision of "a" names key "new" (first in line there), and "a" goes back
        # (or its lease lapses)
        q.enqueue("a", {"v": 2}, revision="2", concurrency_key="new", priority=1)
        if back == "finish":
            q.complete(first)
            assert must_get(q, "a").concurrency_key == "new"
        else:
            advance_past(leaseq_store.store, first.lease_until)
            if back == "reclaim":
                assert q.reclaim_expired() == (0, 1)
        # Then "a" waits for a slot of "new", whichever way the claim comes (old's spare slot
        # is not the one it would run in)
        if back == "lapse-claim-one":
            assert q.claim_one("a", W1) is None
        assert q.claim(W1, limit=10) == []
        # And once one of "new"'s jobs finishes, "a" runs under "new"
        q.complete(running_new[0])  # type: ignore[arg-type]
        if back.startswith("lapse"):
            assert q.reclaim_expired() == (0, 1)  # a lapsed one comes back at the sweep
        (again,) = q.claim(W1, limit=10)
        assert (again.id, again.revision, again.concurrency_key) == ("a", "2", "new")

    def test_a_cancelled_revision_keeps_its_new_key(self, leaseq_store: FreshStore) -> None:
        q = leaseq_store.queue()
        q.enqueue("a", {"v": 1}, revision="1", concurrency_key="old")
        q.claim(W1)
        q.enqueue("a", {"v": 2}, revision="2", concurrency_key=None)
        assert q.cancel("a")
        assert q.requeue("a")
        (again,) = q.claim(W1)
        assert (again.revision, again.concurrency_key) == ("2", None)

    def test_claim_one_obeys_the_key_limit(self, leaseq_store: FreshStore) -> None:
        _needs_limits(leaseq_store)
        q = leaseq_store.queue(key_limit=1)
        q.enqueue("a0", {}, concurrency_key="a")
        q.enqueue("a1", {}, concurrency_key="a")
        assert q.claim_one("a0", W1) is not None
        assert q.claim_one("a1", W2) is None
        assert must_get(q, "a1").status == "pending"

    def test_key_limit_holds_across_threads_and_processes(
        self, leaseq_store: FreshStore
    ) -> None:
        _needs_limits(leaseq_store)
        # Given 1,000 jobs over 10 keys, key_limit 2, each key's jobs in one run of the
        # queue's order (without the limit, every worker would take the same key's jobs)
        q = leaseq_store.queue(key_limit=KEY_LIMIT)
        q.enqueue_many([q.spec(f"job-{i:04d}", {"n": i}, concurrency_key=_block_key(i))
                        for i in range(KEY_JOBS)])
        # When 4 processes of 2 threads each claim, hold and finish them all
        barrier = multiprocessing.get_context("spawn").Manager().Barrier(4)
        results = run_processes(_keyed_process, [
            (leaseq_store.url, dict(leaseq_store.options), q.name, barrier, f"p{i}")
            for i in range(4)], timeout_s=180)
        spans = [span for spans in results for span in spans]
        # Then every job ran once and is done, and no key ever ran more than 2 at once
        assert len(spans) == KEY_JOBS
        assert q.counts() == {"done": KEY_JOBS}
        peaks = max_running_per_key(spans)
        assert set(peaks) == {f"key-{k}" for k in range(KEYS)}
        assert max(peaks.values()) <= KEY_LIMIT, peaks
        assert max(peaks.values()) == KEY_LIMIT  # the limit, not a lock, shaped the run

    def test_key_limit_holds_across_threads_of_one_process(
        self, leaseq_store: FreshStore
    ) -> None:
        _needs_limits(leaseq_store)
        q = leaseq_store.queue(key_limit=KEY_LIMIT)
        q.enqueue_many([q.spec(f"job-{i:04d}", {"n": i}, concurrency_key=f"key-{i % 3}")
                        for i in range(200)])
        spans = _keyed_threads(q, "local", threads=8)
        assert len(spans) == 200 and q.counts() == {"done": 200}
        assert max(max_running_per_key(spans).values()) <= KEY_LIMIT

    def test_a_killed_workers_slot_comes_back_when_its_lease_is_reclaimed(
        self, leaseq_store: FreshStore
    ) -> None:
        _needs_limits(leaseq_store)
        # Given key_limit 1 and two jobs of one key, one held by a worker that is SIGKILLed
        q = leaseq_store.queue(key_limit=1)
        q.enqueue("k0", {}, concurrency_key="k")
        q.enqueue("k1", {}, concurrency_key="k")
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        child = ctx.Process(target=_hold_one_and_wait, daemon=True, args=(
            leaseq_store.url, dict(leaseq_store.options), q.name, out))
        child.start()
        held = out.get(timeout=60)
        child.kill()
        child.join(timeout=10)
        # Then its slot stays taken while the job is processing
        assert q.claim(W1, limit=5) == []
        assert q.held_back() == HeldBack(by_key=1, by_rate=0)
        # And once its lease has run out, the held-back count frees the slot before the sweep
        # does (the lapsed job is ready itself: an autoscaler at zero replicas must start the
        # worker whose first sweep frees it), while the claim still waits for the sweep
        advance(leaseq_store.store, 5)
        assert q.held_back() == HeldBack(by_key=1, by_rate=0)  # 2 ready, 1 free slot
        assert q.claim(W1, limit=5) == []
        # When the sweeper reclaims it
        assert q.reclaim_expired() == (0, 1)
        # Then the key's slot is free again: one job of the key is claimed, not two
        taken = q.claim(W1, limit=5)
        assert len(taken) == 1 and {held, taken[0].id} <= {"k0", "k1"}
        assert q.claim(W2, limit=5) == []

    def test_limited_queues_names_the_queues_whose_claims_ran_with_limits(
        self, leaseq_store: FreshStore
    ) -> None:
        _needs_limits(leaseq_store)
        store = leaseq_store.store
        # Given a store where no limited claim has run yet
        assert store.limited_queues() == {}
        # When one queue claims under a key limit, one under a rate, one with no limits
        for name, policy in [("keyed", {"key_limit": 2}), ("rated", {"rate_per_s": 3}),
                             ("free", {})]:
            q = leaseq_store.queue(name, **policy)
            q.enqueue("a", {}, concurrency_key="k")
            assert len(q.claim(W1, limit=1)) == 1
        # Then the two limited queues are named with their limits, and the other is not
        assert store.limited_queues() == {"keyed": ClaimLimits(key_limit=2),
                                          "rated": ClaimLimits(rate_per_s=3)}
        assert store.held_back("free") == HeldBack()

    def test_a_claim_without_limits_forgets_the_limits_an_earlier_claim_recorded(
        self, leaseq_store: FreshStore
    ) -> None:
        _needs_limits(leaseq_store)
        store = leaseq_store.store
        # Given a queue whose claims ran under a key limit of 1, with 3 jobs of one key ready
        keyed = leaseq_store.queue("thumbs", key_limit=1)
        for i in range(4):
            keyed.enqueue(f"j{i}", {}, concurrency_key="k")
        assert len(keyed.claim(W1, limit=4)) == 1
        assert store.held_back("thumbs") == HeldBack(by_key=3, by_rate=0)
        # When the app drops the limit and a worker claims without it
        free = leaseq_store.queue("thumbs")
        assert len(free.claim(W2, limit=1)) == 1
        # Then nothing counts the ready jobs as held back any more (an autoscaler reading
        # them would otherwise see no runnable work while two wait)
        assert store.limited_queues() == {}
        assert store.held_back("thumbs") == HeldBack()
        # and a limited claim records its limits again
        assert keyed.claim(W1, limit=4) == []
        assert store.limited_queues() == {"thumbs": ClaimLimits(key_limit=1)}

    # --- rate limit ----------------------------------------------------------------------

    def test_the_rate_limit_admits_the_room_left_in_the_window(
        self, leaseq_store: FreshStore
    ) -> None:
        _needs_limits(leaseq_store)
        # Given a queue limited to 3 claims a second and 10 ready jobs
        q = leaseq_store.queue(rate_per_s=3)
        q.enqueue_many([q.spec(f"j{i}", {}) for i in range(10)])
        advance(leaseq_store.store, 5)  # due long ago, whatever the clock does below
        # When workers ask for more, within one second of the store's clock (the test moves
        # the clock back by the time the calls took, so a slow machine reads the same)
        started = time.monotonic()
        first, second = len(q.claim(W1, limit=2)), len(q.claim(W2, limit=5))
        advance(leaseq_store.store, -(time.monotonic() - started))
        third = len(q.claim(W1, limit=5))
        # Then 3 were taken, and the rest are ready: held back by the rate, those beyond one
        # second's claims (not the room left in this window, which is none: an autoscaler
        # would read no work at all)
        assert (first, second, third) == (2, 1, 0)
        assert q.held_back() == HeldBack(by_key=0, by_rate=4)
        # And a second later the window has room again
        advance(leaseq_store.store, 1.01 + (time.monotonic() - started))
        assert len(q.claim(W1, limit=5)) == 3

    def test_no_sliding_second_holds_more_claims_than_the_rate(
        self, leaseq_store: FreshStore
    ) -> None:
        _needs_limits(leaseq_store)
        # Given a queue limited to 20 claims a second, and more jobs than it may take
        q = leaseq_store.queue(rate_per_s=RATE)
        q.enqueue_many([q.spec(f"j{i:04d}", {}) for i in range(400)])
        # When 4 processes claim as fast as they can for 3 s
        barrier = multiprocessing.get_context("spawn").Manager().Barrier(4)
        results = run_processes(_rated_process, [
            (leaseq_store.url, dict(leaseq_store.options), q.name, barrier, f"rate-{i}")
            for i in range(4)], timeout_s=120)
        taken = [span for spans in results for span in spans]
        # Then no one-second window holds more than 20 claims, and the rate was reached
        assert max_in_any_window(taken) <= RATE
        assert RATE * RATE_RUN_S * 0.6 <= len(taken) <= RATE * (RATE_RUN_S + 1)

    def test_limits_are_validated(self, leaseq_store: FreshStore) -> None:
        for bad in ({"key_limit": 0}, {"rate_per_s": 0}, {"rate_per_s": 1.5},
                    {"key_limit": True}, {"rate_per_s": 10_001}):
            with pytest.raises(InvalidPolicy):
                leaseq_store.queue(**bad)
