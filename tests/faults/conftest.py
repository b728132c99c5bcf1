"""Fixtures of the fault-injection suite: the store kinds, a run folder, the run's seed.

``LEASEQ_CHAOS_SEED`` replays a failing run's seed; PostgreSQL runs are skipped, with the
reason, when the server cannot be reached (``LEASEQ_TEST_POSTGRES_URL``, default the local one),
except the partition scenarios: they start a cluster of their own, so they run anyway, and
skip (or, under ``CI=true``, fail) only for a reason of their own (``skip_or_fail``).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from chaos_scenarios import OWN_CLUSTER

from leaseq.testing.chaos import DEFAULT_POSTGRES_URL, postgres_reachable


@pytest.fixture(scope="session")
def chaos_seed() -> int:
    seed = os.environ.get("LEASEQ_CHAOS_SEED")
    return int(seed) if seed else random.SystemRandom().randrange(1, 10**9)


@pytest.fixture(scope="session")
def chaos_root() -> Iterator[str]:
    root = tempfile.mkdtemp(prefix="leaseq-chaos-")
    yield root
    if not os.listdir(root):  # failing runs keep their folders (and say where)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def chaos_store(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    if request.param == "sqlite":
        return "sqlite", None
    url = os.environ.get("LEASEQ_TEST_POSTGRES_URL") or DEFAULT_POSTGRES_URL
    reason = postgres_reachable(url)
    if reason and not _own_cluster(request):
        pytest.skip(reason)
    return "postgres", url


def _own_cluster(request: pytest.FixtureRequest) -> bool:
    """Whether the test runs a scenario that never uses the shared server (``OWN_CLUSTER``)."""
    callspec = getattr(request.node, "callspec", None)
    return callspec is not None and callspec.params.get("name") in OWN_CLUSTER
