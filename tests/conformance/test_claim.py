"""Claim, and concurrent claims by threads and processes (leaseq.testing.conformance)."""

from leaseq.testing.conformance import ClaimSuite


class TestClaim(ClaimSuite):
    pass
