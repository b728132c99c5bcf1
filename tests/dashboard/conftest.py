"""Fixtures of the dashboard's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from dashboard_data import given_jobs

import leaseq
from leaseq.stores.base import Store


@pytest.fixture
def store(tmp_path) -> Iterator[Store]:
    store = leaseq.connect(f"sqlite:///{tmp_path}/jobs.db")
    given_jobs(store)
    yield store
    store.close()
