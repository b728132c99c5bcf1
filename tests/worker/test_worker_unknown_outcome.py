"""A finishing write whose outcome is unknown (the connection was lost while it committed) is
written again, fenced, and never assumed (issue 14): when the retry is refused, the journal
says whether the first write was saved under this lease."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from worker_helpers import running, wait_until

import leaseq
from leaseq.errors import StoreUnavailable


def _commit_then_lose(store: Any, name: str) -> list[int]:
    """The first call of ``store.<name>`` commits, then loses its answer."""
    calls: list[int] = []
    original = getattr(store, name)

    def lost_answer(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        result = original(*args, **kwargs)
        if len(calls) == 1:
            raise StoreUnavailable("lost the connection while committing; the outcome is "
                                   "unknown")
        return result

    setattr(store, name, lost_answer)
    return calls


@pytest.mark.parametrize("outcome, write", [("done", "complete_many"),
                                            ("retried", "retry_later")])
def test_a_write_that_landed_but_lost_its_answer_is_found_saved(
        app: leaseq.App, caplog: pytest.LogCaptureFixture, outcome: str, write: str) -> None:
    # Given a store whose first finishing write commits and then loses its answer
    @app.task(queue="work", max_attempts=3)
    def task(fail: bool, job: leaseq.Job) -> str:
        if fail and job.attempts == 1:
            raise RuntimeError("try again")
        return "ok"

    calls = _commit_then_lose(app.store, write)
    job_id = task.enqueue(fail=outcome == "retried").job_id
    q = app.queue("work")
    caplog.set_level(logging.INFO, logger="leaseq")
    with running(app, concurrency=1):
        # When the worker finishes the job
        wait_until(lambda: "unknown outcome had been saved" in caplog.text,
                   "the refused retry looked up", timeout_s=10)
        wait_until(lambda: q.get(job_id).status == "done", "the job done", timeout_s=10)
    # Then the retry was refused (fenced), the journal showed the first write saved, and the
    # worker neither wrote twice nor called the result discarded
    assert calls
    assert "result discarded" not in caplog.text
    saved = [e for e in q.journal(job_id) if e.event in ("result_saved", "retry_scheduled")
             and e.lease_epoch == 1]
    assert len(saved) == 1


def test_a_finish_journaled_by_another_workers_claim_at_the_same_epoch_is_not_this_ones(
        app: leaseq.App) -> None:
    # Given a job this worker (W1) claimed, deleted while it ran and enqueued again, whose new
    # life another worker (W2) claimed and finished at the same epoch 1: the journal goes on
    # from the old life's, so it holds a finish at epoch 1 that is not W1's
    from leaseq.browse import BulkAction
    from leaseq.runner import InFlight, Runner

    store = app.store
    q = store.queue("work")
    q.enqueue("j1", {})
    (old,) = q.claim("host:1:w1", lease_s=60)
    assert q.cancel("j1")
    store.act_on_jobs("work", BulkAction.DELETE, ["j1"], "bob")
    q.enqueue("j1", {})
    (new,) = q.claim("host:2:w2", lease_s=60)
    q.complete(new)
    assert new.lease_epoch == old.lease_epoch
    # When W1's write of an unknown outcome is refused and W1 asks whether it had landed
    landed = Runner._landed_earlier(InFlight(old, None, q, 60, 20, 0))
    # Then the other worker's finish is not taken for its own
    assert landed is None
    assert Runner._landed_earlier(InFlight(new, None, q, 60, 20, 0)) is not None
