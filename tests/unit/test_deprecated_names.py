"""The names renamed in 0.2 still work for one release: each warns (``DeprecationWarning``,
naming the new one) and does what the new name does."""

from __future__ import annotations

import warnings

import pytest

import leaseq
import leaseq.job


def test_queue_list_retry_and_claim_id_warn_and_forward(store: leaseq.Store) -> None:
    # Given a failed job and a pending one
    q = store.queue("images")
    q.enqueue("a", {})
    q.enqueue("b", {})
    q.fail(q.claim("w")[0], "corrupt")
    # When the old names are called, Then each warns with the new name and answers as it
    with pytest.warns(DeprecationWarning, match=r"Queue\.list_jobs") as warned:
        assert [j.id for j in q.list()] == ["a", "b"]
    assert warned[0].filename == __file__  # the warning points at the caller's line
    with pytest.warns(DeprecationWarning, match=r"Queue\.requeue"):
        assert q.retry("a") is True
    with pytest.warns(DeprecationWarning, match=r"Queue\.claim_one"):
        job = q.claim_id("b", "w")
    assert job is not None and job.id == "b"
    assert "requeued" in [e.event for e in q.journal("a")]


def test_store_list_retry_claim_id_and_record_warn_and_forward(store: leaseq.Store) -> None:
    # Given a done job
    q = store.queue("images")
    q.enqueue("a", {})
    q.complete(q.claim("w")[0])
    # When the store's old names are called, Then each warns and forwards
    with pytest.warns(DeprecationWarning, match=r"Store\.list_jobs"):
        assert [j.id for j in store.list("images", "done")] == ["a"]
    with pytest.warns(DeprecationWarning, match=r"Store\.requeue"):
        assert store.retry("images", "a") is True
    with pytest.warns(DeprecationWarning, match=r"Store\.claim_one"):
        assert store.claim_id("images", "a", "w", 60) is not None
    with pytest.warns(DeprecationWarning, match=r"Store\.append_journal"):
        store.record("images", "a", "ack_sent", reason="acked")
    assert q.journal("a")[-1].event == "ack_sent"


def test_outcome_is_the_enqueue_outcome_under_its_old_name() -> None:
    with pytest.warns(DeprecationWarning, match=r"leaseq\.EnqueueOutcome") as warned:
        assert leaseq.Outcome is leaseq.EnqueueOutcome  # type: ignore[attr-defined]
    assert warned[0].filename == __file__
    with pytest.warns(DeprecationWarning, match=r"leaseq\.job\.EnqueueOutcome"):
        from leaseq.job import Outcome  # type: ignore[attr-defined]
    assert Outcome is leaseq.EnqueueOutcome


def test_the_new_names_and_unknown_names_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert leaseq.EnqueueOutcome.CREATED == "created"
        with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
            leaseq.Nothing  # type: ignore[attr-defined]  # noqa: B018
