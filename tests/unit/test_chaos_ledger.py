"""``leaseq.testing.chaos.Ledger.classify``: a repeat is judged against the first making of the
same effect key, and against the epoch that first finished the job (its journal's)."""

from __future__ import annotations

from pathlib import Path

import leaseq
from leaseq.job import Job
from leaseq.testing.chaos import Ledger
from leaseq.testing.chaos.measure import _finishes

JOB = "poison-00001"


def _job(epoch: int, status: str = "processing") -> Job:
    return Job(JOB, "chaos", status, {}, lease_epoch=epoch)


def _ledger(tmp_path: Path) -> Ledger:
    return Ledger(str(tmp_path / "effects.db"))


def test_effects_are_keyed_by_job_and_effect_with_the_epoch_that_first_made_each(
        tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    assert ledger.effects() == {}
    for epoch in (1, 2, 3):
        assert ledger.record(_job(epoch), f"attempt-{epoch}")
    assert not ledger.record(_job(3), "attempt-1")
    assert ledger.effects() == {(JOB, "attempt-1"): 1, (JOB, "attempt-2"): 2,
                                (JOB, "attempt-3"): 3}
    assert ledger.repeats() == [(JOB, "attempt-1", 3)]


def test_a_same_epoch_repeat_of_an_earlier_effect_key_is_a_duplicate(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    ledger.record(_job(1), "attempt-1")
    ledger.record(_job(1), "attempt-1")  # the same lease made it twice
    ledger.record(_job(2), "attempt-2")
    ledger.record(_job(3), "attempt-3")
    duplicates, reruns, details = ledger.classify({JOB: _job(3, "failed")})
    assert (duplicates, reruns) == (1, 0)
    assert details == [f"{JOB}: attempt-1 repeated by epoch 1 (first by 1, finished at 3)"]


def test_a_later_epoch_redoing_an_effect_after_a_lost_lease_is_a_fenced_rerun(
        tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    ledger.record(_job(1), "work")
    ledger.record(_job(1), "attempt-1")  # then its worker is killed
    ledger.record(_job(2), "work")  # the next lease does the work again and finishes
    ledger.record(_job(2), "attempt-2")
    assert ledger.classify({JOB: _job(2, "done")}) == (0, 1, [])
    assert ledger.classify({JOB: _job(2, "done")}, {JOB: 2}) == (0, 1, [])


def test_a_job_run_again_after_it_finished_is_a_duplicate_though_it_finished_again(
        tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    ledger.record(_job(1), "work")  # epoch 1 finished the job
    ledger.record(_job(2), "work")  # epoch 2 ran it again for nothing, and finished it again
    duplicates, reruns, details = ledger.classify({JOB: _job(2, "done")}, {JOB: 1})
    assert (duplicates, reruns) == (1, 0)
    assert details == [f"{JOB}: work repeated by epoch 2 (first by 1, finished at 1)"]


def test_the_journal_gives_the_epoch_of_a_jobs_first_finish(store: leaseq.Store) -> None:
    q = store.queue("chaos")
    q.enqueue("twice", {})
    q.enqueue("never", {})
    for _ in range(2):  # finished, re-driven by the operator, finished again
        job = q.claim_one("twice", "w", lease_s=60)
        assert job is not None
        q.complete(job, {"epoch": job.lease_epoch})
        assert q.requeue("twice")
    assert _finishes(q, ["twice", "never"]) == ({"twice": 2, "never": 0}, {"twice": 1})
