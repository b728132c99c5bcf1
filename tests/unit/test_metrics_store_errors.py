"""The gauge collectors over a store that raises something other than a ``LeaseqError`` (a
driver's own error, as psycopg's UndefinedTable before a migration): the scrape is answered,
``leaseq_store_up`` reads 0, and the error is logged masked, without its traceback."""

from __future__ import annotations

import logging
from typing import Any

import psycopg.errors
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import leaseq
from leaseq.metrics import Metrics

SECRET = "hunter2"


def _undefined_table(*args: Any) -> Any:
    raise psycopg.errors.UndefinedTable(
        f'relation "leaseq_jobs" does not exist (password={SECRET})')


def _registry(store: leaseq.Store) -> CollectorRegistry:
    metrics = Metrics()
    metrics.watch_store(store, lambda: ["work"], refresh_s=5)
    metrics.watch_schedules(store)
    return metrics.registry


def test_a_drivers_error_reads_as_the_store_down_and_the_scrape_answers(
    store: leaseq.Store, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given gauges over a store whose reads raise a driver's error, not a leaseq one
    monkeypatch.setattr(store, "queues", _undefined_table)
    monkeypatch.setattr(store, "limited_queues", _undefined_table)
    monkeypatch.setattr(store, "schedules", _undefined_table)
    registry = _registry(store)
    # When Prometheus scrapes
    with caplog.at_level(logging.WARNING, logger="leaseq.metrics"):
        text = generate_latest(registry).decode()
    # Then the scrape is answered, the store reads as down, and no gauge is made up
    assert "leaseq_store_up 0.0" in text
    assert registry.get_sample_value("leaseq_ready_jobs", {"queue": "work"}) is None
    # And each failure is logged by its type, masked, with no traceback
    logged = [r for r in caplog.records if r.name == "leaseq.metrics"]
    assert [r.getMessage().split(": UndefinedTable")[0] for r in logged] == [
        "metrics: cannot read queue gauges from the store",
        "metrics: cannot read the schedule ledger"]
    assert all(r.exc_info is None and SECRET not in r.getMessage() for r in logged)
