"""Every error a user can meet is defined in ``leaseq.errors`` and exported from ``leaseq``;
the two that used to live elsewhere are still importable from there, as the same class."""

from __future__ import annotations

import inspect

import leaseq
import leaseq.app
import leaseq.errors
import leaseq.job


def test_every_public_exception_of_leaseq_errors_is_exported_from_leaseq() -> None:
    defined = {name for name, value in inspect.getmembers(leaseq.errors, inspect.isclass)
               if issubclass(value, Exception) and value.__module__ == "leaseq.errors"}
    assert {"LeaseLost", "PayloadMismatch", "TopologyError"} <= defined
    assert defined <= set(leaseq.__all__)
    for name in defined:
        assert getattr(leaseq, name) is getattr(leaseq.errors, name)


def test_lease_lost_and_payload_mismatch_are_still_where_they_were() -> None:
    assert leaseq.job.LeaseLost is leaseq.errors.LeaseLost
    assert leaseq.app.PayloadMismatch is leaseq.errors.PayloadMismatch
    assert issubclass(leaseq.PayloadMismatch, leaseq.errors.InvalidPayload)
    assert issubclass(leaseq.TopologyError, leaseq.LeaseqError)
