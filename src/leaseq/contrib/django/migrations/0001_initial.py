"""leaseq's tables through Django's migrations, so ``manage.py migrate`` (and every test
database Django creates) has them. The DDL itself is leaseq's own (the store's SQL
migrations, the same that ``leaseq migrate`` applies), run on the database of
``settings.LEASEQ_URL``'s alias; other aliases are left alone."""

from __future__ import annotations

from typing import Any

from django.db import migrations


def create_tables(apps: Any, schema_editor: Any) -> None:
    from leaseq.contrib.django.settings import store_url
    from leaseq.contrib.django.store import parse_django_url
    from leaseq.stores import connect

    url = store_url()
    if not url.startswith("django:"):
        return  # leaseq lives in another database: ``leaseq migrate`` prepares that one
    if parse_django_url(url)[0] != schema_editor.connection.alias:
        return
    with connect(url) as store:
        store.migrate()


class Migration(migrations.Migration):
    # leaseq's SQLite migrations run their own transactions, so this one must not be in one.
    atomic = False
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(create_tables, migrations.RunPython.noop)]
