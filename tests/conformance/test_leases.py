"""Heartbeats, fencing, expiry and reclaim (leaseq.testing.conformance)."""

from leaseq.testing.conformance import LeaseSuite


class TestLeases(LeaseSuite):
    pass
