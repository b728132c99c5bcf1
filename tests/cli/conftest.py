"""Fixtures for the CLI tests: a fresh database per test and a runner bound to it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import leaseq
from leaseq.cli import cli


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'jobs.db'}"


@pytest.fixture
def invoke(url: str) -> Callable[..., Result]:
    """``invoke("status", "--json")``: run the CLI against this test's database."""
    runner = CliRunner()

    def run(*args: str, input: str | None = None, env: dict | None = None) -> Result:
        return runner.invoke(cli, list(args), input=input,
                             env={"LEASEQ_URL": url, **(env or {})})

    return run


@pytest.fixture
def store(url: str) -> Iterator[leaseq.Store]:
    store = leaseq.connect(url)
    yield store
    store.close()
