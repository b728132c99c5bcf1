"""The ``leaseq`` command line: workers, producers, inspection, upkeep, metrics, broker delivery
and the demo.

Exit status: 0 success, 1 the database (or broker) could not be used, or the job does not
exist, 2 bad arguments (with a usage message). Human output is rich tables; ``--json`` is for
machines.

This module holds the group, ``main`` and what every command shares: the one ``--url`` and
``--json`` options and the one mapping of leaseq's typed errors to exit statuses. The commands
live in ``worker`` (the worker), ``jobs`` (enqueue, inspect, failed, requeue, cancel), ``ops``
(status, sweep, migrate, metrics), ``broker`` (RabbitMQ delivery) and ``demo``; ``render``
draws tables and the journal's story.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from leaseq.errors import InvalidInput, InvalidURL, LeaseqError
from leaseq.redact import redact_url
from leaseq.stores import DEFAULT_URL, connect
from leaseq.stores.base import Store

if TYPE_CHECKING:
    from leaseq.app import App

Command = TypeVar("Command", bound=Callable[..., Any])


class Failed(click.ClickException):
    """The command could not do its work (exit 1): one clear line on stderr."""

    def show(self, file: Any = None) -> None:
        click.echo(f"leaseq: {self.format_message()}", err=True)


def errors(func: Command) -> Command:
    """Map leaseq's typed errors to exit statuses: bad input → usage (2), the rest → 1."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except LeaseqError as exc:
            # A URL that cannot be used is a database problem (1), not a usage error (2).
            if isinstance(exc, InvalidInput) and not isinstance(exc, InvalidURL):
                raise click.UsageError(str(exc), click.get_current_context()) from None
            raise Failed(str(exc)) from None
    return cast(Command, wrapper)


def need_extra(extra: str, what: str, *modules: str) -> None:
    """Fail in one line when one of ``modules``, which ``pip install 'leaseq[extra]'``
    installs, cannot be imported. Called first: before a store is opened, or created."""
    try:
        for module in modules:
            importlib.import_module(module)
    except ImportError:
        raise Failed(f"{what} needs its extra: pip install 'leaseq[{extra}]'") from None


def need_rabbitmq() -> None:
    """The check of every command that speaks to RabbitMQ."""
    need_extra("rabbitmq", "broker delivery", "pika")


class Seconds(click.FloatRange):
    """A number of seconds in a range; unlike click's ``FloatRange``, ``nan`` and ``inf`` are
    refused (``nan`` passes every bound: a grace of ``nan`` gave a running job back at once, a
    refresh of ``nan`` froze the metrics)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return number


def url_option(func: Command) -> Command:
    return click.option("--url", envvar="LEASEQ_URL", default=None, metavar="URL",
                        help=f"Store URL (env LEASEQ_URL; default {DEFAULT_URL}).")(func)


def app_url_option(func: Command) -> Command:
    """``--url`` of the commands that load MODULE:APP: see ``url_for_app``."""
    return click.option("--url", envvar="LEASEQ_URL", default=None, metavar="URL",
                        help="Store URL in place of the app's own (default: the store the "
                             "app names; for an app that names none, env LEASEQ_URL, then "
                             f"{DEFAULT_URL}).")(func)


def url_for_app(app: App, url: str | None) -> str | None:
    """The store a command that loads ``app`` opens in place of the app's own: a ``--url``
    given on the command line, else None. ``$LEASEQ_URL`` does not override an app that names
    its store (``App("postgresql://…")``): the app's producers write there, so its worker must
    serve it, and a different ``$LEASEQ_URL`` is named on stderr. For an app that names none,
    ``$LEASEQ_URL`` is its store (``App``'s default)."""
    context = click.get_current_context(silent=True)
    if not app.url or context is None or (context.get_parameter_source("url")
                                          is not click.core.ParameterSource.ENVIRONMENT):
        return url
    if url and url != app.url:
        click.echo(f"leaseq: serving the store the app names ({redact_url(app.url)}); "
                   f"$LEASEQ_URL ({redact_url(url)}) is not used: pass --url to serve another",
                   err=True)
    return None


def concurrency_option(func: Command) -> Command:
    return click.option("--concurrency", type=click.IntRange(1, 10_000), default=10,
                        show_default=True, help="Jobs in flight per process (with RabbitMQ, "
                        "also the unacked deliveries of each queue).")(func)


def grace_option(func: Command) -> Command:
    return click.option("--grace-s", type=Seconds(0), default=30.0, show_default=True,
                        help="On SIGTERM, how long in-flight jobs may finish before being "
                             "given back.")(func)


def no_scheduler_option(func: Command) -> Command:
    return click.option("--no-scheduler", is_flag=True, help="Do not run the app's schedules "
                        "here (by default every polling worker runs them, and a broker "
                        "consumer warns that it does not; each tick is still one job)."
                        )(func)


def warn_of_queues_without_tasks(app: App, queues: tuple[str, ...]) -> None:
    """Name on stderr each ``--queue`` no task of the app is declared on: a typo would serve an
    empty queue and exit 0 (its jobs still run if they name a task of the app)."""
    declared = app.queue_names()
    for queue in dict.fromkeys(queues):
        if queue not in declared:
            click.echo(f"leaseq: no task of the app is declared on queue {queue!r} (its tasks' "
                       f"queues: {', '.join(declared) or 'none'}); is the name right?", err=True)


def json_option(func: Command) -> Command:
    return click.option("--json", "as_json", is_flag=True, help="Machine output.")(func)


#: What the CLI logs with (``--log-level``, or ``-v`` for info).
LOG_LEVELS = ("debug", "info", "warning", "error")

#: pika's loggers and their level unless ``--log-level debug``. At INFO pika narrates each
#: channel it opens and closes (a pair per passive declare), and its connection loggers report
#: each failed connect at ERROR with a traceback: leaseq says the same in one line
#: (``BrokerUnavailable``: the masked URL and the cause), so those are heard only when CRITICAL.
QUIET_LOGGERS = {
    "pika": logging.WARNING,
    "pika.adapters.blocking_connection": logging.CRITICAL,
    "pika.adapters.utils.connection_workflow": logging.CRITICAL,
    "pika.adapters.utils.io_services_utils": logging.CRITICAL,
    "pika.connection": logging.CRITICAL,
}


def log_level_option(default: str) -> Callable[[Command], Command]:
    return click.option("--log-level", type=click.Choice(LOG_LEVELS), default=default,
                        show_default=True, help="What to log (debug: pika's own log too).")


def setup_logging(level: str) -> None:
    """The CLI's logging, on stderr: ``level`` (one of ``LOG_LEVELS``) for leaseq, pika at
    ``QUIET_LOGGERS`` unless it is debug."""
    logging.basicConfig(level=getattr(logging, level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name, quiet in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(logging.NOTSET if level == "debug" else quiet)


def open_store(url: str | None, *, create: bool = True) -> Store:
    """The store at ``url`` (``None``: ``$LEASEQ_URL``, then the default). The commands that
    only read it, or act on jobs already there, pass ``create=False``: a mistyped URL is then
    ``StoreNotFound`` (exit 1), not a new empty store reported as healthy."""
    return connect(url, create=create)


def warn_of_empty_queues(store: Store, names: list[str]) -> None:
    """Say on stderr which of the queues asked for hold no job: a typo must not read as an
    empty queue (nor, to an autoscaler, as no work)."""
    empty = sorted(set(names) - set(store.queues()))
    if empty:
        click.echo(f"no jobs in queue(s): {', '.join(empty)} (is the name right?)", err=True)


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="leaseq")
def cli() -> None:
    """leaseq: a durable job queue whose database record is the job's state."""


def main() -> None:
    cli(prog_name="leaseq")


def _register_commands() -> None:
    # Imported here, after the shared options exist: each module decorates with them. The
    # broker commands import pika only when they run, so the core install stays light.
    from leaseq.cli import broker, dashboard, demo, doctor, jobs, ops, schedules, worker

    for module in (worker, jobs, ops, broker, demo, schedules, doctor, dashboard):
        for command in module.COMMANDS:
            cli.add_command(command)


_register_commands()
