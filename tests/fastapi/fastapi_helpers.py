"""What the FastAPI tests share: a store URL of a test's own, on SQLite or PostgreSQL."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


def fresh_store_url(kind: str, tmp_path: Path) -> str:
    """A new SQLite file (``kind == "sqlite"``), or a new PostgreSQL schema; skips the test
    when PostgreSQL does not answer. The caller drops the schema."""
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.db'}"
    psycopg = pytest.importorskip("psycopg", reason="leaseq[postgres] is not installed")
    base = os.environ.get("LEASEQ_TEST_POSTGRES_URL") or DEFAULT_POSTGRES_URL
    try:
        psycopg.connect(base, connect_timeout=3).close()
    except psycopg.Error:
        pytest.skip("PostgreSQL not reachable")
    return f"{base}{'&' if '?' in base else '?'}schema=api_{uuid.uuid4().hex[:12]}"
