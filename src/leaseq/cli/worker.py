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
    concurrency_option,
    errors,
    grace_option,
    log_level_option,
    need_rabbitmq,
    no_scheduler_option,
    setup_logging,
    url_for_app,
    warn_of_queues_without_tasks,
)
from leaseq.cli.broker import consume_app


@click.command()
@click.argument("app_ref", metavar="MODULE:APP")
@app_url_option
@click.option("--queue", "queues", multiple=True, help="Queue to serve (repeat). "
              "Default: every queue the app's tasks use.")
@concurrency_option
@click.option("--processes", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Worker processes (each with --concurrency slots).")
@click.option("--burst", is_flag=True, help="Exit 0 once nothing is claimable or in flight.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics here (process i of --processes uses PORT+i).")
@grace_option
@click.option("--sweep-every-s", type=Seconds(0, min_open=True), default=30.0,
              show_default=True, help="How often to reclaim expired leases.")
@no_scheduler_option
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
    """``--delivery rabbitmq``: what the polling worker has and a consumer has not is refused,
    then it is ``leaseq rabbitmq consume``."""
    if not amqp_url:
        raise click.UsageError("--delivery rabbitmq needs --amqp-url (or LEASEQ_AMQP_URL)")
    if burst or processes != 1:
        raise click.UsageError("--delivery rabbitmq runs one process and has no --burst; "
                               "start more consumers to scale out")
    consume_app(app_ref, url, amqp_url, queues, concurrency=concurrency, grace_s=grace_s,
                prefix=prefix, no_scheduler=no_scheduler)


COMMANDS = [worker]
