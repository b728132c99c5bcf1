"""The worker registry's beat of a RabbitMQ consumer (``leaseq.delivery.registry``): one
registration per store at once, none of its errors the consumer's end, and a clean stop
leaves the registry."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

import leaseq
from leaseq.browse import WorkerInfo
from leaseq.delivery.registry import RegistryBeat


def test_a_beat_registers_each_store_and_a_clean_stop_unregisters(tmp_path: Path) -> None:
    # Given two queues on one store and one on another
    one, other = (leaseq.connect(f"sqlite:///{tmp_path / n}.db") for n in ("one", "other"))
    queues = [one.queue("a"), one.queue("b"), other.queue("c")]
    # When a beat runs
    with RegistryBeat("consumer-1", queues, lambda: 3, every_s=60):
        # Then each store holds the consumer with its own queues, at once
        for store, names in ((one, ["a", "b"]), (other, ["c"])):
            (info,) = _wait_registered(store)
            assert (sorted(info.queues), info.in_flight) == (names, 3)
    # And a clean stop leaves both registries
    assert one.list_workers() == [] and other.list_workers() == []


def test_a_failing_beat_is_logged_masked_and_never_raised(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Given a store whose registry refuses with an error holding a secret
    store = leaseq.connect(f"sqlite:///{tmp_path / 'jobs.db'}")
    failed = threading.Event()

    def refuse(*args: object) -> None:
        failed.set()
        raise RuntimeError("cannot reach postgresql://app:Zq9secret@db/jobs")

    store.register_worker = refuse  # type: ignore[method-assign]
    # When the beat runs, Then the error is logged masked, and the stop is clean
    with caplog.at_level(logging.WARNING, logger="leaseq"), \
            RegistryBeat("consumer-1", [store.queue("a")], lambda: 0, every_s=60):
        assert failed.wait(10)
    assert "worker registry beat failed: RuntimeError" in caplog.text
    assert "Zq9secret" not in caplog.text


def _wait_registered(store: leaseq.Store) -> list[WorkerInfo]:
    for _ in range(1000):
        if found := store.list_workers():
            return found
        threading.Event().wait(0.01)
    raise AssertionError("never registered")
