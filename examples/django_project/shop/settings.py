"""Settings of the example shop: SQLite by default (``SHOP_DB`` names the file)."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "example-only-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True
ROOT_URLCONF = "shop.urls"
INSTALLED_APPS = ["django.contrib.contenttypes", "leaseq.contrib.django", "shop"]
MIDDLEWARE: list[str] = []
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SHOP_DB", str(BASE_DIR / "shop.db")),
        # Several processes (the server, the worker) write: take the write lock up front.
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30},
    },
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# leaseq: the App of this project, on Django's own connection.
LEASEQ_APP = "shop.jobs:app"
LEASEQ_URL = "django://default"
