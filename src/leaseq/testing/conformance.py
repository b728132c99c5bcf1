"""The store conformance suite: every behaviour a leaseq store promises, as tests.

A store that passes it is a leaseq store (DESIGN.md §6). The tests live here, in the library,
so a third-party store runs exactly the same ones (the pattern of Huey's ``StorageTests`` and
River's ``riverdrivertest``). To run them:

1. Implement ``StoreFactory``: ``create()`` gives a ``FreshStore`` (a new, empty store, and the
   URL + options that let other processes open the same database); ``destroy()`` deletes it.
2. Give pytest a fixture named ``leaseq_store`` that yields one per test::

       @pytest.fixture
       def leaseq_store():
           with fresh_store(MyFactory()) as fresh:
               yield fresh

3. Bind the suites in a test module: ``class TestClaim(ClaimSuite): pass`` for each class in
   ``ALL_SUITES`` (parametrise the fixture to run several stores). Call
   ``pytest.register_assert_rewrite("leaseq.testing")`` at the top of your conftest, before
   importing leaseq.testing, so failed asserts show their values.

Time is moved with the store's test-only ``time_offset_s``; races are made with threads and
``spawn`` processes. A store must therefore honour ``time_offset_s`` in every query.
"""

from leaseq.testing.harness import FreshStore, StoreFactory, fresh_store
from leaseq.testing.suites.claim import ClaimSuite
from leaseq.testing.suites.enqueue import EnqueueSuite
from leaseq.testing.suites.finish import FinishSuite
from leaseq.testing.suites.giveback import GiveBackSuite
from leaseq.testing.suites.journal import JournalSuite
from leaseq.testing.suites.leases import LeaseSuite
from leaseq.testing.suites.outbox_reowe import OutboxReoweSuite
from leaseq.testing.suites.retry import RetrySuite
from leaseq.testing.suites.upkeep import ClockSuite, InspectionSuite, OperatorSuite, UpkeepSuite

#: Every suite class; a store's test module subclasses each one.
ALL_SUITES = (
    ClaimSuite,
    LeaseSuite,
    RetrySuite,
    GiveBackSuite,
    EnqueueSuite,
    FinishSuite,
    JournalSuite,
    UpkeepSuite,
    InspectionSuite,
    OperatorSuite,
    ClockSuite,
    OutboxReoweSuite,
)

__all__ = [
    "ALL_SUITES",
    "ClaimSuite",
    "ClockSuite",
    "EnqueueSuite",
    "FinishSuite",
    "FreshStore",
    "GiveBackSuite",
    "InspectionSuite",
    "JournalSuite",
    "LeaseSuite",
    "OperatorSuite",
    "OutboxReoweSuite",
    "RetrySuite",
    "StoreFactory",
    "UpkeepSuite",
    "fresh_store",
]
