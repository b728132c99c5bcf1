"""The worker's log records carry ``action``, ``queue``, ``job_id`` and ``attempt`` as
attributes (``leaseq.logfields``), so logs can be filtered rather than parsed."""

from __future__ import annotations

import logging

import pytest

import leaseq
from leaseq.logfields import FIELDS
from leaseq.worker import Worker, WorkerConfig


def test_records_can_be_filtered_by_action_queue_and_job(
        app: leaseq.App, caplog: pytest.LogCaptureFixture) -> None:
    # Given a job that fails for good and one whose handler raises, in a queue of two tries
    @app.task(queue="work", max_attempts=2)
    def convert(path: str) -> None:
        if path == "corrupt.png":
            raise leaseq.Permanent("not an image")
        raise ConnectionError("upstream timed out")

    convert.enqueue(path="corrupt.png", job_id="bad")
    convert.enqueue(path="a.png", job_id="flaky")
    # When a burst worker runs them, its records captured
    with caplog.at_level(logging.INFO, logger="leaseq"):
        Worker(app, WorkerConfig(burst=True)).run()
    # Then filtering on the action finds each outcome, with the job it is about
    permanent = [r for r in caplog.records if getattr(r, "action", None) == "permanent"]
    assert [(r.queue, r.job_id, r.attempt) for r in permanent] == [  # type: ignore[attr-defined]
        ("work", "bad", 1)]
    raised = [r for r in caplog.records if getattr(r, "action", None) == "handler_raised"]
    assert [(r.job_id, r.attempt) for r in raised] == [  # type: ignore[attr-defined]
        ("flaky", 1), ("flaky", 2)]
    # And every record of the worker, runner and heartbeat carries all four fields
    ours = [r for r in caplog.records
            if r.name in ("leaseq.worker", "leaseq.runner", "leaseq.heartbeat")]
    assert {getattr(r, "action", None) for r in ours} >= {"worker_started", "burst_done"}
    assert all(hasattr(r, name) for r in ours for name in FIELDS)
