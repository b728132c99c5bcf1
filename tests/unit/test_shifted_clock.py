"""``leaseq.testing.harness.shifted_clock``: leaseq's clocks run ahead, and nothing else of
leaseq changes: a datetime made outside the block is still a datetime inside it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from leaseq import browse, job
from leaseq.browse import JobFilter
from leaseq.testing.harness import shifted_clock


def test_leaseqs_clock_runs_ahead_inside_the_block() -> None:
    before = datetime.now(UTC)
    with shifted_clock(3600):
        ahead = job.datetime.now(UTC)
    assert timedelta(minutes=59) < ahead - before < timedelta(minutes=61)
    assert job.datetime is datetime  # put back after


def test_a_datetime_made_outside_the_block_is_still_one_inside_it() -> None:
    # Given a datetime from before the block (a user's bound, a job read earlier)
    since = datetime(2024, 1, 1, tzinfo=UTC)
    record = job.Job(queue="q", id="j", payload={}, status="pending", created_at=since,
                     updated_at=since)
    with shifted_clock(3600):
        # Then leaseq's own checks still take it (they were made against the shifted class)
        assert isinstance(since, browse.datetime)
        assert JobFilter("q", updated_from=since).updated_from == since
        assert json.dumps(record.to_dict())
