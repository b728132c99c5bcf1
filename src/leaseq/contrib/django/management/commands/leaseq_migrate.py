"""``manage.py leaseq_migrate``: create or upgrade leaseq's tables in the Django database.

``manage.py migrate`` does it too (the ``leaseq`` app's migration calls the same code); this
command is for a store URL other than ``settings.LEASEQ_URL`` and for upgrades of leaseq
between Django migrations.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from leaseq.contrib.django.settings import store_url
from leaseq.stores import connect


class Command(BaseCommand):
    help = "Create or upgrade leaseq's job tables (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--url", default=None,
                            help="store URL (default: settings.LEASEQ_URL or django://default)")

    def handle(self, *args: Any, url: str | None = None, **options: Any) -> None:
        target = url or store_url()
        with connect(target) as store:
            version = store.migrate()
        self.stdout.write(f"leaseq schema at version {version} on {store.url}")
