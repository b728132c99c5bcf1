"""Retry backoff, snooze, error text and stale revisions (leaseq.testing.conformance)."""

from leaseq.testing.conformance import RetrySuite


class TestRetry(RetrySuite):
    pass
