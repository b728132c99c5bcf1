"""The conformance suite (leaseq.testing.conformance) on leaseq's own stores: one test class
per suite in ``ALL_SUITES`` (``TestClaim``, ``TestOutbox``, ``TestTransaction``…), each run on
every store of conftest.py's ``leaseq_store``. A suite added to ``ALL_SUITES`` runs here
without a change to this file."""

from leaseq.testing.conformance import ALL_SUITES, bind_suites

globals().update(bind_suites(ALL_SUITES))
