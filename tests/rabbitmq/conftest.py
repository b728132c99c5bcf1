"""Fixtures for the RabbitMQ integration tests: a vhost of its own per test (deleted after),
a fresh SQLite file shared by the test's processes, and a way to start and reap them.

The broker is ``$LEASEQ_TEST_AMQP_URL`` (default ``amqp://guest:guest@127.0.0.1:5672/%2F``);
each test gets a new vhost made with ``rabbitmqctl``. Without a reachable broker, or without
``rabbitmqctl``, the tests are skipped with that reason.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest
from rabbit_harness import Harness, base_url, rabbitmqctl, reachable

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def broker_ok() -> None:
    reason = reachable(base_url())
    if reason:
        pytest.skip(reason)


@pytest.fixture
def broker_url(broker_ok: None) -> str:
    """The broker's own URL (its default vhost), for a test whose commands never get as far as
    declaring anything (a refused port, login or vhost made from it): no vhost to make."""
    return base_url()


@pytest.fixture
def amqp_url(broker_ok: None) -> Iterator[str]:
    """A fresh vhost with full rights for the URL's user; deleted after the test."""
    vhost = f"leaseq-test-{uuid.uuid4().hex[:10]}"
    parts = urlsplit(base_url())
    rabbitmqctl("add_vhost", vhost)
    rabbitmqctl("set_permissions", "-p", vhost, parts.username or "guest", ".*", ".*", ".*")
    try:
        yield urlunsplit((parts.scheme, parts.netloc, "/" + quote(vhost, safe=""), "", ""))
    finally:
        rabbitmqctl("delete_vhost", vhost)


@pytest.fixture
def harness(amqp_url: str, tmp_path: Path) -> Iterator[Harness]:
    """A fresh SQLite file shared by the test's processes."""
    world = Harness(tmp_path, amqp_url, f"sqlite:///{tmp_path / 'jobs.db'}")
    world.store()  # creates the schema before several processes race for it
    try:
        yield world
    finally:
        world.close()


@pytest.fixture
def postgres_harness(amqp_url: str, tmp_path: Path) -> Iterator[Harness]:
    """A fresh PostgreSQL schema shared by the test's processes; dropped after."""
    base = os.environ.get("LEASEQ_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    parts = urlsplit(base)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5432), 3).close()
    except OSError as exc:
        pytest.skip(f"PostgreSQL not reachable at {parts.hostname}:{parts.port or 5432}: {exc}")
    schema = f"lq_rmq_{uuid.uuid4().hex[:10]}"
    url = f"{base}{'&' if parts.query else '?'}schema={schema}"
    world = Harness(tmp_path, amqp_url, url)
    store = world.store()
    try:
        yield world
    finally:
        world.stop_all()
        store.drop()
        world.close()
