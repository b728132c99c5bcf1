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
    os.environ["DJANGO_SETTINGS_MODULE"] = "leaseq_test_settings"
    sys.path.insert(0, str(HERE))
    django.setup()


def aliases() -> list[str]:
    return ["default", "pg"] if os.environ.get("LEASEQ_DJANGO_PG_NAME") else ["default"]


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: object) -> Iterator[None]:
    """The test databases, leaseq's tables in each: ``default`` got them from the Django
    migration (``LEASEQ_URL`` names it); ``pg`` through ``leaseq_migrate``."""
    from django.core.management import call_command

    if "pg" in aliases():
        with django_db_blocker.unblock():  # type: ignore[attr-defined]
            call_command("leaseq_migrate", url="django://pg")
    yield


def worker_env() -> dict[str, str]:
    """The environment of a worker process on the same test databases."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    env["DJANGO_SETTINGS_MODULE"] = "leaseq_test_settings"
    return env


_TABLES = {"sqlite": ("leaseq_jobs", "leaseq_journal"),
           "postgresql": ("leaseq.jobs", "leaseq.journal")}


@pytest.fixture(autouse=True)
def _empty_leaseq_tables(request: pytest.FixtureRequest) -> Iterator[None]:
    """Django flushes only its models' tables between transactional tests: empty leaseq's."""
    yield
    if "django_db_setup" not in request.fixturenames:
        return
    from django.db import connections

    for alias in aliases():
        with connections[alias].cursor() as cursor:
            for table in _TABLES[connections[alias].vendor]:
                cursor.execute(f"DELETE FROM {table}")
