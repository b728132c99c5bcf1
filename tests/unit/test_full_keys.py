"""FullKeys: after a key-limited claim comes back short, the worker leaves that queue out of
its claim rounds until one of its own jobs of it settles, ``recheck_s`` passes (unless one of
them is being finished), or it holds none of them."""

from __future__ import annotations

from leaseq.prefetch import FullKeys


def holding() -> bool:
    return True


def not_finishing(queue: str = "") -> bool:
    """None of the worker's jobs is being finished (no completion is being written)."""
    return False


def test_a_short_claim_leaves_the_queue_out_until_a_job_of_it_settles() -> None:
    keys = FullKeys(recheck_s=0.01)
    mark = keys.before_claim("q")
    keys.after_claim("q", mark, sent_at=100.0, short=True)
    assert keys.left_out("q", 100.005, holding, not_finishing)
    assert not keys.left_out("other", 100.005, holding, not_finishing)
    keys.settled("other")
    assert keys.left_out("q", 100.005, holding, not_finishing)
    keys.settled("q")
    assert not keys.left_out("q", 100.005, holding, not_finishing)


def test_a_job_that_settled_while_the_claim_was_out_counts() -> None:
    # The claim found the key full, but the worker's job holding it settled before the claim
    # came back: the next round must claim, not wait
    keys = FullKeys(recheck_s=0.01)
    mark = keys.before_claim("q")
    keys.settled("q")
    keys.after_claim("q", mark, sent_at=100.0, short=True)
    assert not keys.left_out("q", 100.001, holding, not_finishing)


def test_recheck_s_bounds_the_wait_and_holding_nothing_ends_it() -> None:
    keys = FullKeys(recheck_s=0.01)
    keys.after_claim("q", keys.before_claim("q"), sent_at=100.0, short=True)
    assert abs(keys.until_recheck(100.004, not_finishing) - 0.006) < 1e-9
    assert not keys.left_out("q", 100.01, holding, not_finishing)
    assert not keys.left_out("q", 100.001, lambda: False, not_finishing)
    assert keys.until_recheck(100.02, not_finishing) == float("inf")


def test_a_full_claim_clears_the_mark() -> None:
    keys = FullKeys(recheck_s=0.01)
    keys.after_claim("q", keys.before_claim("q"), sent_at=100.0, short=True)
    keys.after_claim("q", keys.before_claim("q"), sent_at=100.001, short=False)
    assert not keys.left_out("q", 100.002, holding, not_finishing)
    assert keys.until_recheck(100.002, not_finishing) == float("inf")


def test_while_a_job_of_the_queue_is_being_finished_the_recheck_waits_for_it() -> None:
    # The worker's own job of the queue has run and its completion is being written: it will
    # settle (and wake the worker) within milliseconds, and a recheck now would find the keys
    # as full as the claim did
    keys = FullKeys(recheck_s=0.01, finishing_max_s=1.0)
    keys.after_claim("q", keys.before_claim("q"), sent_at=100.0, short=True)
    keys.after_claim("r", keys.before_claim("r"), sent_at=100.0, short=True)
    finishing = {"q"}
    assert keys.left_out("q", 100.05, holding, lambda: "q" in finishing)
    assert not keys.left_out("r", 100.05, holding, lambda: "r" in finishing)
    assert abs(keys.until_recheck(100.004, finishing.__contains__) - 0.006) < 1e-9
    finishing.add("r")
    assert abs(keys.until_recheck(100.004, finishing.__contains__) - 0.996) < 1e-9
    # And its settling ends the wait
    keys.settled("q")
    assert not keys.left_out("q", 100.05, holding, lambda: True)


def test_a_finish_that_takes_long_holds_the_recheck_back_no_longer_than_finishing_max_s(
        ) -> None:
    # A completion write retried against a busy store: the worker polls again after
    # finishing_max_s (its idle_max_s), as it would for any queue
    keys = FullKeys(recheck_s=0.01, finishing_max_s=1.0)
    keys.after_claim("q", keys.before_claim("q"), sent_at=100.0, short=True)
    assert keys.left_out("q", 100.999, holding, lambda: True)
    assert not keys.left_out("q", 101.0, holding, lambda: True)
    assert keys.until_recheck(101.0, lambda queue: True) == float("inf")
