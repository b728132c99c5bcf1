"""The journal (leaseq.testing.conformance)."""

from leaseq.testing.conformance import JournalSuite


class TestJournal(JournalSuite):
    pass
