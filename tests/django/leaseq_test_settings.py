"""Django settings of the Django tests, and of the worker processes they start.

``default`` is SQLite, ``pg`` PostgreSQL (present only when the server answers). Paths and
names come from the environment so a worker process opens the very test databases.
"""

from __future__ import annotations

import os

SECRET_KEY = "leaseq-tests-only"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "leaseq.contrib.django", "django_tasks",
                  "djangotest_app"]
LEASEQ_APP = "djangotest_app.jobs:app"
LEASEQ_URL = "django://default"
TASKS = {"default": {"BACKEND": "leaseq.contrib.django.tasks.LeaseqBackend",
                     "QUEUES": ["default", "other"]},
         "immediate": {"BACKEND": "django_tasks.backends.immediate.ImmediateBackend"}}

_SQLITE = os.environ.get("LEASEQ_DJANGO_SQLITE", "/tmp/leaseq-django-tests.db")
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3", "NAME": _SQLITE,
        "TEST": {"NAME": _SQLITE},
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30,
                    "init_command": "PRAGMA journal_mode=WAL"},
    },
}
if os.environ.get("LEASEQ_DJANGO_PG_NAME"):
    DATABASES["pg"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["LEASEQ_DJANGO_PG_NAME"],
        "USER": os.environ.get("LEASEQ_DJANGO_PG_USER", "postgres"),
        "HOST": os.environ.get("LEASEQ_DJANGO_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("LEASEQ_DJANGO_PG_PORT", "5432"),
        # In a worker process this names the test database itself.
        "TEST": {"NAME": os.environ["LEASEQ_DJANGO_PG_NAME"]},
    }
