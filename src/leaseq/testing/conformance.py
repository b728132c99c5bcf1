"""The store conformance suite: every behaviour a leaseq store promises, as tests.

A store that passes it is a leaseq store (DESIGN.md §6). The tests live here, in the library,
so a third-party store runs exactly the same ones (the pattern of Huey's ``StorageTests`` and
River's ``riverdrivertest``). To run them (docs/stores.md walks through it):

1. Implement ``StoreFactory``: ``create()`` gives a ``FreshStore`` (a new, empty store, the
   URL + options that let other processes open the same database, and optionally how a
   caller opens a transaction on it); ``destroy()`` deletes it.
2. Give pytest a fixture named ``leaseq_store`` that yields one per test::

       @pytest.fixture
       def leaseq_store():
           with fresh_store(MyFactory()) as fresh:
               yield fresh

3. Bind every suite in one test module::

       from leaseq.testing.conformance import ALL_SUITES, bind_suites

       globals().update(bind_suites(ALL_SUITES))

   (or ``class TestClaim(ClaimSuite): pass`` for the ones you pick). Call
   ``pytest.register_assert_rewrite("leaseq.testing")`` at the top of your conftest, before
   importing leaseq.testing, so failed asserts show their values.

Time is moved with the store's test-only ``time_offset_s``; races are made with threads and
``spawn`` processes. A store must therefore honour ``time_offset_s`` in every query. A store
whose ``supports_transactions`` is False has ``TransactionSuite`` skipped, with the reason.
"""

from collections.abc import Iterable

from leaseq.testing.harness import FreshStore, StoreFactory, fresh_store
from leaseq.testing.suites.async_api import AsyncApiSuite
from leaseq.testing.suites.claim import ClaimSuite
from leaseq.testing.suites.enqueue import EnqueueSuite
from leaseq.testing.suites.finish import FinishSuite
from leaseq.testing.suites.giveback import GiveBackSuite
from leaseq.testing.suites.journal import JournalSuite
from leaseq.testing.suites.leases import LeaseSuite
from leaseq.testing.suites.limits import LimitsSuite
from leaseq.testing.suites.operators import OperatorToolsSuite
from leaseq.testing.suites.outbox import OutboxSuite
from leaseq.testing.suites.outbox_reowe import OutboxReoweSuite
from leaseq.testing.suites.retry import RetrySuite
from leaseq.testing.suites.schedules import ScheduleLedgerSuite, ScheduleSuite
from leaseq.testing.suites.transactions import NO_TRANSACTIONS, TransactionSuite
from leaseq.testing.suites.upkeep import ClockSuite, InspectionSuite, OperatorSuite, UpkeepSuite

#: Every suite class, one line each: a new suite joins every store's run by being added here.
ALL_SUITES: tuple[type, ...] = (
    ClaimSuite,
    LeaseSuite,
    RetrySuite,
    GiveBackSuite,
    EnqueueSuite,
    FinishSuite,
    JournalSuite,
    OutboxSuite,
    TransactionSuite,
    UpkeepSuite,
    InspectionSuite,
    OperatorSuite,
    ClockSuite,
    OutboxReoweSuite,
    LimitsSuite,
    ScheduleSuite,
    ScheduleLedgerSuite,
    OperatorToolsSuite,
    AsyncApiSuite,
)


def bind_suites(suites: Iterable[type] = ALL_SUITES) -> dict[str, type]:
    """A pytest test class per suite, named ``Test`` + the suite's name without ``Suite``
    (``ClaimSuite`` → ``TestClaim``); put them in a test module's namespace."""
    bound: dict[str, type] = {}
    for suite in suites:
        name = "Test" + suite.__name__.removesuffix("Suite")
        bound[name] = type(name, (suite,), {})
    return bound


__all__ = [
    "ALL_SUITES",
    "NO_TRANSACTIONS",
    "ClaimSuite",
    "ClockSuite",
    "EnqueueSuite",
    "FinishSuite",
    "FreshStore",
    "GiveBackSuite",
    "InspectionSuite",
    "JournalSuite",
    "LeaseSuite",
    "LimitsSuite",
    "OperatorSuite",
    "OperatorToolsSuite",
    "OutboxReoweSuite",
    "OutboxSuite",
    "RetrySuite",
    "ScheduleLedgerSuite",
    "ScheduleSuite",
    "StoreFactory",
    "TransactionSuite",
    "UpkeepSuite",
    "bind_suites",
    "fresh_store",
]
