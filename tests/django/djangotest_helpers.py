"""Helpers of the Django tests (this folder is on sys.path once its conftest configured
Django)."""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).parent


def aliases() -> list[str]:
    return ["default", "pg"] if os.environ.get("LEASEQ_DJANGO_PG_NAME") else ["default"]


def worker_env() -> dict[str, str]:
    """The environment of a worker process on the same test databases."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    env["DJANGO_SETTINGS_MODULE"] = "leaseq_test_settings"
    return env
