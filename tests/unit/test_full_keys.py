"""FullKeys: after a key-limited claim comes back short, the worker leaves that queue out of
its claim rounds until one of its own jobs of it settles, ``recheck_s`` passes, or it holds
none of them."""

from __future__ import annotations

from leaseq.prefetch import FullKeys


def holding() -> bool:
    return True


def test_a_short_claim_leaves_the_queue_out_until_a_job_of_it_settles() -> None:
    keys = FullKeys(recheck_s=0.01)
    mark = keys.before_claim("q")
    keys.after_claim("q", mark, sent_at=100.0, short=True)
    assert keys.left_out("q", 100.005, holding)
    assert not keys.left_out("other", 100.005, holding)
    keys.settled("other")
    assert keys.left_out("q", 100.005, holding)
    keys.settled("q")
    assert not keys.left_out("q", 100.005, holding)


def test_a_job_that_settled_while_the_claim_was_out_counts() -> None:
    # The claim found the key full, but the worker's job holding it settled before the claim
    # came back: the next round must claim, not wait
    keys = FullKeys(recheck_s=0.01)
    mark = keys.before_claim("q")
    keys.settled("q")
    keys.after_claim("q", mark, sent_at=100.0, short=True)
    assert not keys.left_out("q", 100.001, holding)


def test_recheck_s_bounds_the_wait_and_holding_nothing_ends_it() -> None:
    keys = FullKeys(recheck_s=0.01)
    keys.after_claim("q", keys.before_claim("q"), sent_at=100.0, short=True)
    assert abs(keys.until_recheck(100.004) - 0.006) < 1e-9
    assert not keys.left_out("q", 100.01, holding)
    assert not keys.left_out("q", 100.001, lambda: False)
    assert keys.until_recheck(100.02) == float("inf")


def test_a_full_claim_clears_the_mark() -> None:
    keys = FullKeys(recheck_s=0.01)
    keys.after_claim("q", keys.before_claim("q"), sent_at=100.0, short=True)
    keys.after_claim("q", keys.before_claim("q"), sent_at=100.001, short=False)
    assert not keys.left_out("q", 100.002, holding)
    assert keys.until_recheck(100.002) == float("inf")
