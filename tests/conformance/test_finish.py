"""Complete, follow-ups and quarantine (leaseq.testing.conformance)."""

from leaseq.testing.conformance import FinishSuite


class TestFinish(FinishSuite):
    pass
