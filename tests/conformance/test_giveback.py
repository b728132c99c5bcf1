"""Give-back: free when unstarted, bounded when it ran, never a snooze
(leaseq.testing.conformance)."""

from leaseq.testing.conformance import GiveBackSuite


class TestGiveBack(GiveBackSuite):
    pass
