"""The outbox owes a publish again for a dead-lettered message (leaseq.testing.conformance)."""

from leaseq.testing.conformance import OutboxReoweSuite


class TestOutboxReowe(OutboxReoweSuite):
    pass
