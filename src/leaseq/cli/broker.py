"""``leaseq dispatch`` and ``leaseq rabbitmq …``: the broker-delivery commands.

Each imports pika (through ``leaseq.delivery``) only when it runs, so the core install stays
light.
"""

from __future__ import annotations

import logging

import click

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
    open_store,
    setup_logging,
    url_for_app,
    url_option,
    warn_of_queues_without_tasks,
)
from leaseq.signals import stop_event

_amqp = click.option("--amqp-url", envvar="LEASEQ_AMQP_URL", required=True,
                     help="RabbitMQ URL, e.g. amqp://user:pass@host:5672/vhost "
                          "(or LEASEQ_AMQP_URL).")
_queues = click.option("--queue", "queues", multiple=True,
                       help="A leaseq queue (repeatable).")
_prefix = click.option("--prefix", default="leaseq", show_default=True,
                       help="First part of leaseq's exchange and queue names.")
_no_declare = click.option("--no-declare", is_flag=True,
                           help="Only check the topology; never create anything.")


_verbose = click.option("-v", "--verbose", is_flag=True, help="= --log-level info.")


def _logging(verbose: bool, log_level: str) -> None:
    setup_logging("info" if verbose and log_level == "warning" else log_level)


@click.command("dispatch")
@url_option
@_amqp
@_queues
@_prefix
@_no_declare
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--poll-interval-s", type=Seconds(0.01), default=1.0, show_default=True)
@click.option("--reclaim-every-s", type=Seconds(0), default=30.0, show_default=True,
              help="Reclaim expired leases this often (0: never).")
@click.option("--discover-every-s", type=Seconds(0), default=5.0, show_default=True,
              help="Without --queue: read the store's queues again this often, and serve "
                   "the new ones.")
@log_level_option("warning")
@_verbose
@errors
def dispatch(url: str | None, amqp_url: str, queues: tuple[str, ...], prefix: str,
             no_declare: bool, batch_size: int, poll_interval_s: float, reclaim_every_s: float,
             discover_every_s: float, log_level: str, verbose: bool) -> None:
    """Publish ready, unpublished jobs to RabbitMQ (the outbox) until SIGTERM: of each
    --queue, or else of every queue of the store, those made later included."""
    need_rabbitmq()
    from leaseq.delivery.rabbitmq import DispatcherConfig, Topology, run_dispatcher

    _logging(verbose, log_level)
    config = DispatcherConfig(batch_size=batch_size, poll_interval_s=poll_interval_s,
                              reclaim_every_s=reclaim_every_s,
                              discover_every_s=discover_every_s)
    with open_store(url) as store, stop_event() as stop:
        names = list(queues) or store.queues() or ["default"]
        run_dispatcher([store.queue(n) for n in names], amqp_url, stop=stop,
                       declare=not no_declare, topology=Topology(prefix=prefix), config=config,
                       discover=None if queues else store)


@click.group("rabbitmq")
def rabbitmq() -> None:
    """Broker delivery through RabbitMQ: consumer, topology, quarantine, republish (the
    outbox's publisher is `leaseq dispatch`)."""


@rabbitmq.command("consume")
@click.argument("app_ref", metavar="MODULE:APP")
@app_url_option
@_amqp
@_queues
@_prefix
@concurrency_option
@grace_option
@no_scheduler_option
@log_level_option("warning")
@_verbose
@errors
def consume(app_ref: str, url: str | None, amqp_url: str, queues: tuple[str, ...],
            prefix: str, concurrency: int, grace_s: float, no_scheduler: bool, log_level: str,
            verbose: bool) -> None:
    """Run MODULE:APP's tasks on RabbitMQ deliveries (= leaseq worker --delivery rabbitmq)."""
    need_rabbitmq()
    _logging(verbose, log_level)
    consume_app(app_ref, url, amqp_url, queues, concurrency=concurrency, grace_s=grace_s,
                prefix=prefix, no_scheduler=no_scheduler)


def consume_app(app_ref: str, url: str | None, amqp_url: str, queues: tuple[str, ...], *,
                concurrency: int, grace_s: float, prefix: str, no_scheduler: bool) -> None:
    """The one broker consumer of both ``leaseq rabbitmq consume`` and ``leaseq worker
    --delivery rabbitmq``: the app's tasks and outcomes, deliveries pushed by RabbitMQ, on
    ``url``'s store or else the app's own."""
    from leaseq.delivery.rabbitmq import Topology, run_app_consumer

    app = App.from_ref(app_ref)
    url = url_for_app(app, url)
    warn_of_queues_without_tasks(app, queues)
    if app.schedules and not no_scheduler:
        logging.getLogger(__name__).warning(
            "a broker consumer runs no scheduler: the app's schedules (%s) tick only where "
            "`leaseq scheduler %s` or a polling `leaseq worker` runs (--no-scheduler silences "
            "this)", ", ".join(sorted(app.schedules)), app_ref)
    with stop_event() as stop:
        run_app_consumer(app, amqp_url, queues=queues, store=open_store(url) if url else None,
                         concurrency=concurrency, grace_s=grace_s, stop=stop,
                         topology=Topology(prefix=prefix))


@rabbitmq.command("topology")
@_amqp
@_queues
@_prefix
@_no_declare
@errors
def topology(amqp_url: str, queues: tuple[str, ...], prefix: str, no_declare: bool) -> None:
    """Declare leaseq's exchanges and queues (idempotent) or, with --no-declare, check them."""
    need_rabbitmq()
    from leaseq.delivery.rabbitmq import Topology, declare_topology
    from leaseq.delivery.topology import RABBITMQ_DEFAULT_DELIVERY_LIMIT

    if not queues:
        raise click.UsageError("give at least one --queue")
    setup_logging("warning")
    topo = Topology(prefix=prefix)
    limited = declare_topology(queues, amqp_url, topology=topo, declare=not no_declare)
    for name in queues:
        click.echo(f"{name}: {topo.exchange} -[{name}]-> {topo.work_queue(name)} "
                   f"-(dead-letter)-> {topo.dead_letter_exchange} -> "
                   f"{topo.reason_exchange} -(rejected)-> {topo.quarantine_queue(name)}, "
                   f"-(delivery_limit)-> {topo.delivery_limit_queue(name)}: ok")
        for holding in (held for queue, held in limited if queue == name):
            click.echo(f"  {holding}: RabbitMQ 4's default delivery limit of "
                       f"{RABBITMQ_DEFAULT_DELIVERY_LIMIT} applies (declared without "
                       "x-delivery-limit): a message returned to it that often is dropped; "
                       "drain it, delete it, and run this command again")


@rabbitmq.command("quarantine")
@_amqp
@click.option("--queue", required=True, help="The leaseq queue.")
@_prefix
@click.option("--limit", type=click.IntRange(0, 1000), default=20, show_default=True)
@errors
def quarantine(amqp_url: str, queue: str, prefix: str, limit: int) -> None:
    """Show the dead-lettered messages of a queue (job id and x-death), leaving them there."""
    need_rabbitmq()
    from leaseq.delivery.quarantine import peek
    from leaseq.delivery.rabbitmq import Topology

    setup_logging("warning")
    count, items = peek(amqp_url, Topology(prefix=prefix), queue, limit)
    click.echo(f"{count} message(s) in {Topology(prefix=prefix).quarantine_queue(queue)}")
    for item in items:
        click.echo(f"  job {item['job_id']!r}: {item['reason']} from {item['from_queue']} "
                   f"×{item['count']} (then `leaseq inspect {item['job_id']}`)")


@rabbitmq.command("republish")
@url_option
@click.option("--queue", "queues", multiple=True, help="A leaseq queue (repeatable; default: "
              "every queue).")
@click.option("--older-than-s", type=Seconds(0), required=True,
              help="Owe a new publish for pending jobs published more than S seconds ago.")
@errors
def republish(url: str | None, queues: tuple[str, ...], older_than_s: float) -> None:
    """After a broker lost messages (a purged or lost queue): pending jobs published long ago
    are published again by the dispatcher. A job that still had its message gets a second
    one, which its claim makes harmless."""
    with open_store(url, create=False) as store:
        for name in list(queues) or store.queues():
            click.echo(f"{name}: {store.queue(name).republish(older_than_s)} job(s) owed again")


COMMANDS = [dispatch, rabbitmq]
