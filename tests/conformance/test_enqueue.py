"""Idempotent enqueue, conflicts and refused input (leaseq.testing.conformance)."""

from leaseq.testing.conformance import EnqueueSuite


class TestEnqueue(EnqueueSuite):
    pass
