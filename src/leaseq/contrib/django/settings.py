"""leaseq's Django settings, read when used (never at import):

* ``LEASEQ_APP`` — ``"MODULE:APP"`` of the project's ``leaseq.App`` (the worker command, the
  django-tasks backend and the test helpers find it there).
* ``LEASEQ_URL`` — the store the migration and ``leaseq_migrate`` prepare. Defaults to
  ``"django://default"``.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from leaseq.app import App

DEFAULT_URL = "django://default"


def store_url() -> str:
    return str(getattr(settings, "LEASEQ_URL", DEFAULT_URL))


def project_app() -> App:
    """The App ``settings.LEASEQ_APP`` names."""
    ref = getattr(settings, "LEASEQ_APP", None)
    if not ref:
        raise ImproperlyConfigured("set LEASEQ_APP = 'yourproject.jobs:app' (the module and "
                                   "name of your leaseq.App) in the Django settings")
    return App.from_ref(str(ref))
