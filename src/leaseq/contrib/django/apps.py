"""The Django app: add ``"leaseq.contrib.django"`` to ``INSTALLED_APPS``."""

from __future__ import annotations

from django.apps import AppConfig


class LeaseqConfig(AppConfig):
    name = "leaseq.contrib.django"
    label = "leaseq"
    verbose_name = "leaseq jobs"
