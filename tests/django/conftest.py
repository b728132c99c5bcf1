"""Django for the Django tests: settings from ``leaseq_test_settings``, configured when this
folder is collected (pytest-django then provides the test databases). The ``pg`` alias, a
PostgreSQL test database of a name unique to this run, exists only when the server answers."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("django", reason="leaseq[django] is not installed")
pytest.importorskip("pytest_django", reason="pytest-django is not installed")

HERE = Path(__file__).parent
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _postgres_answers() -> bool:
    try:
        import psycopg

        psycopg.connect(os.environ.get("LEASEQ_TEST_POSTGRES_URL") or DEFAULT_POSTGRES_URL,
                        connect_timeout=3).close()
        return True
    except Exception:
        return False


def pytest_configure(config: pytest.Config) -> None:
    import django

    os.environ.setdefault("LEASEQ_DJANGO_SQLITE",
                          f"/tmp/leaseq-django-{os.getpid()}-{uuid.uuid4().hex[:6]}.db")
    if _postgres_answers():
        os.environ.setdefault("LEASEQ_DJANGO_PG_NAME", f"leaseq_dj_{uuid.uuid4().hex[:10]}")
    sys.path.insert(0, str(HERE))
    # settings.configure, not DJANGO_SETTINGS_MODULE: the variable would leak into every
    # process later tests start (a pytest run in another virtualenv, say).
    import leaseq_test_settings
    from django.conf import settings

    settings.configure(**{name: getattr(leaseq_test_settings, name)
                          for name in dir(leaseq_test_settings) if name.isupper()})
    django.setup()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: object) -> Iterator[None]:
    """The test databases, leaseq's tables in each: ``default`` got them from the Django
    migration (``LEASEQ_URL`` names it); ``pg`` through ``leaseq_migrate``."""
    from django.core.management import call_command
    from djangotest_helpers import aliases

    from leaseq import StoreUnavailable

    if "pg" in aliases():
        with django_db_blocker.unblock():  # type: ignore[attr-defined]
            try:
                call_command("leaseq_migrate", url="django://pg")
            except StoreUnavailable:
                pass  # no collected test uses ``pg``: pytest-django did not create it
    yield


_TABLES = {"sqlite": ("leaseq_jobs", "leaseq_journal"),
           "postgresql": ("leaseq.jobs", "leaseq.journal")}


@pytest.fixture(autouse=True)
def _empty_leaseq_tables(request: pytest.FixtureRequest) -> Iterator[None]:
    """Django flushes only its models' tables after a transactional test: empty leaseq's.
    (A ``TestCase`` rolls its transaction back, leaseq's rows with it.)"""
    yield
    marker = request.node.get_closest_marker("django_db")
    if marker is None or not marker.kwargs.get("transaction"):
        return
    from django.db import connections

    for alias in marker.kwargs.get("databases") or ["default"]:
        with connections[alias].cursor() as cursor:
            for table in _TABLES[connections[alias].vendor]:
                cursor.execute(f"DELETE FROM {table}")
