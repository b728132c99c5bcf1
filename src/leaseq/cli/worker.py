"""``leaseq worker``: run an App's tasks, polling the store or on RabbitMQ deliveries."""

from __future__ import annotations

import logging
import sys

import click
from click.core import ParameterSource

from leaseq.app import App
from leaseq.cli import (
    Seconds,
    app_url_option,
    errors,
    log_level_option,
    need_rabbitmq,
    open_store,
    setup_logging,
    url_for_app,
)
from leaseq.signals import stop_event


@click.command()
@click.argument("app_ref", metavar="MODULE:APP")
@app_url_option
@click.option("--queue", "queues", multiple=True, help="Queue to serve (repeat). "
              "Default: every queue the app's tasks use.")
@click.option("--concurrency", type=click.IntRange(1, 10_000), default=10, show_default=True,
              help="Jobs in flight per process.")
@click.option("--processes", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Worker processes (each with --concurrency slots).")
@click.option("--burst", is_flag=True, help="Exit 0 once nothing is claimable or in flight.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics here (process i of --processes uses PORT+i).")
@click.option("--grace-s", type=Seconds(0), default=30.0, show_default=True,
              help="On SIGTERM, how long in-flight jobs may finish before being given back.")
@click.option("--sweep-every-s", type=Seconds(0, min_open=True), default=30.0,
              show_default=True, help="How often to reclaim expired leases.")
@click.option("--no-scheduler", is_flag=True, help="Do not run the app's schedules here "
              "(by default every worker runs them; each tick is still one job).")
@log_level_option("info")
@click.option("--delivery", type=click.Choice(["poll", "rabbitmq"]), default="poll",
              show_default=True, help="poll: claim from the store; rabbitmq: take deliveries "
              "from RabbitMQ (fed by `leaseq dispatch`).")
@click.option("--amqp-url", envvar="LEASEQ_AMQP_URL", default=None, metavar="URL",
              help="RabbitMQ URL for --delivery rabbitmq (or LEASEQ_AMQP_URL).")
@click.option("--prefix", default=None, metavar="PREFIX",
              help="For --delivery rabbitmq: first part of leaseq's exchange and queue names, "
              "as `leaseq dispatch` was given it. [default: leaseq]")
@errors
def worker(app_ref: str, url: str | None, queues: tuple[str, ...], concurrency: int,
           processes: int, burst: bool, metrics_port: int | None, grace_s: float,
           sweep_every_s: float, no_scheduler: bool, log_level: str, delivery: str,
           amqp_url: str | None, prefix: str | None) -> None:
    """Run the tasks of the App at MODULE:APP (e.g. myproject.tasks:app)."""
    from leaseq.supervisor import run_processes, run_worker
    from leaseq.worker import WorkerConfig

    setup_logging(log_level)
    if delivery == "rabbitmq":
        need_rabbitmq()
        _refuse_polling_options(metrics_port)
        _consume(app_ref, url, amqp_url, queues, concurrency, grace_s, burst, processes,
                 prefix or "leaseq", no_scheduler)
        return
    if prefix is not None:
        raise click.UsageError("--prefix names RabbitMQ's exchanges and queues: it goes with "
                               "--delivery rabbitmq")
    if metrics_port is not None and metrics_port + processes - 1 > 65535:
        raise click.UsageError(f"--metrics-port {metrics_port} with --processes {processes}: "
                               f"process i serves port {metrics_port} + i, past 65535")
    config = WorkerConfig(queues=queues, concurrency=concurrency, burst=burst,
                          grace_s=grace_s, sweep_every_s=sweep_every_s,
                          metrics_port=metrics_port, scheduler=not no_scheduler)
    app = App.from_ref(app_ref)  # a bad MODULE:APP is a usage error, before anything starts
    url = url_for_app(app, url)
    warn_of_queues_without_tasks(app, queues)
    if processes == 1:
        code = run_worker(app_ref, url, config)
    else:
        code = run_processes(app_ref, url, config, processes,
                             getattr(logging, log_level.upper()))
    sys.exit(code)


def warn_of_queues_without_tasks(app: App, queues: tuple[str, ...]) -> None:
    """Name on stderr each ``--queue`` no task of the app is declared on: a typo would serve an
    empty queue and exit 0 (its jobs still run if they name a task of the app)."""
    declared = app.queue_names()
    for queue in dict.fromkeys(queues):
        if queue not in declared:
            click.echo(f"leaseq: no task of the app is declared on queue {queue!r} (its tasks' "
                       f"queues: {', '.join(declared) or 'none'}); is the name right?", err=True)


def _refuse_polling_options(metrics_port: int | None) -> None:
    """The options only the polling worker has: given with ``--delivery rabbitmq`` they would
    do nothing, and a deployment moved to push delivery must not lose them without a word."""
    given = click.get_current_context().get_parameter_source("sweep_every_s")
    if metrics_port is not None or given not in (None, ParameterSource.DEFAULT):
        raise click.UsageError(
            "--metrics-port and --sweep-every-s belong to the polling worker: with --delivery "
            "rabbitmq run `leaseq sweep --every S` (the consumer reclaims no expired lease) "
            "and `leaseq metrics` beside it")


def _consume(app_ref: str, url: str | None, amqp_url: str | None, queues: tuple[str, ...],
             concurrency: int, grace_s: float, burst: bool, processes: int,
             prefix: str, no_scheduler: bool) -> None:
    """``--delivery rabbitmq``: the same tasks and outcomes, deliveries pushed by RabbitMQ."""
    from leaseq.delivery.rabbitmq import run_app_consumer
    from leaseq.delivery.topology import Topology

    if not amqp_url:
        raise click.UsageError("--delivery rabbitmq needs --amqp-url (or LEASEQ_AMQP_URL)")
    if burst or processes != 1:
        raise click.UsageError("--delivery rabbitmq runs one process and has no --burst; "
                               "start more consumers to scale out")
    app = App.from_ref(app_ref)
    url = url_for_app(app, url)
    warn_of_queues_without_tasks(app, queues)
    if app.schedules and not no_scheduler:
        logging.getLogger(__name__).warning(
            "--delivery rabbitmq runs no scheduler: the app's schedules (%s) tick only where "
            "`leaseq scheduler %s` or a polling `leaseq worker` runs (--no-scheduler silences "
            "this)", ", ".join(sorted(app.schedules)), app_ref)
    with stop_event() as stop:
        run_app_consumer(app, amqp_url, queues=queues, store=open_store(url) if url else None,
                         concurrency=concurrency, grace_s=grace_s, stop=stop,
                         topology=Topology(prefix=prefix))


COMMANDS = [worker]
