"""``manage.py leaseq_worker``: run the project's leaseq tasks with Django set up.

The App is ``settings.LEASEQ_APP``; jobs run with Django's connections cleaned up around each
(``leaseq.contrib.django.worker``). Queues of the django-tasks backend are served too. As with
``leaseq worker``, a handler still running after the grace period (its job given back) does
not hold up the exit: the process ends at once, so the handler stops with it.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from leaseq.contrib.django import worker
from leaseq.contrib.django.settings import project_app
from leaseq.contrib.django.tasks import backend_queue_names
from leaseq.errors import InvalidInput
from leaseq.supervisor import exit_now_if_stragglers
from leaseq.worker import WorkerConfig


class Command(BaseCommand):
    help = "Run leaseq jobs (the App in settings.LEASEQ_APP) until stopped."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", dest="queues", action="append", default=[],
                            help="queue to serve (repeat); default: every queue of the app "
                                 "and of the django-tasks backends")
        parser.add_argument("--concurrency", type=int, default=10)
        parser.add_argument("--burst", action="store_true",
                            help="exit once nothing is claimable or in flight")
        parser.add_argument("--grace-s", type=float, default=30.0)

    def handle(self, *args: Any, queues: list[str], concurrency: int, burst: bool,
               grace_s: float, **options: Any) -> None:
        logging.basicConfig(level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        app = project_app()
        served = backend_queue_names(app)  # registers the django-tasks runners on the app
        names = queues or sorted(set(app.queue_names()) | set(served))
        config = _config(queues=tuple(names), concurrency=concurrency, burst=burst,
                         grace_s=grace_s)
        exit_now_if_stragglers(worker.run(app, config))


#: The command's options by the ``WorkerConfig`` field each sets.
_OPTIONS = {"concurrency": "--concurrency", "grace_s": "--grace-s"}


def _config(**fields: Any) -> WorkerConfig:
    """The worker's config; a value it refuses is a usage error naming the option, worded
    and exiting (2) as ``leaseq worker``'s, not a traceback."""
    try:
        return WorkerConfig(**fields)
    except InvalidInput as exc:
        for field, option in _OPTIONS.items():
            try:
                WorkerConfig(**{field: fields[field]})
            except InvalidInput as own:
                raise CommandError(f"Invalid value for {option!r}: {own}",
                                   returncode=2) from None
        raise CommandError(str(exc), returncode=2) from None
