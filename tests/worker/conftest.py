"""Fixtures for the worker tests: a fresh SQLite database per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import leaseq


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'jobs.db'}"


@pytest.fixture
def app(url: str) -> Iterator[leaseq.App]:
    """An app on a fresh database; fast backoff so retries happen within a test."""
    app = leaseq.App(url, queues={"work": {"backoff_base_s": 0.0, "backoff_cap_s": 0.0}})
    yield app
    app.store.close()
