"""Fixtures for the unit tests that need a store: a fresh SQLite database per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import leaseq


@pytest.fixture
def store(tmp_path: Path) -> Iterator[leaseq.Store]:
    with leaseq.connect(f"sqlite:///{tmp_path / 'jobs.db'}") as store:
        yield store
