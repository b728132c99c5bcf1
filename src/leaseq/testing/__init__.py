"""Helpers for testing leaseq and the stores written for it.

``leaseq.testing.conformance`` holds the store conformance suite: the tests every store must
pass, written against a ``StoreFactory`` so a third-party store can run them too.
"""

from leaseq.testing.harness import FreshStore, StoreFactory, fresh_store

__all__ = ["FreshStore", "StoreFactory", "fresh_store"]
