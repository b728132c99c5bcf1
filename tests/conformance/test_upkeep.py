"""Purge, migrate, inspection, operator actions and the server clock
(leaseq.testing.conformance)."""

from leaseq.testing.conformance import ClockSuite, InspectionSuite, OperatorSuite, UpkeepSuite


class TestUpkeep(UpkeepSuite):
    pass


class TestInspection(InspectionSuite):
    pass


class TestOperator(OperatorSuite):
    pass


class TestClock(ClockSuite):
    pass
