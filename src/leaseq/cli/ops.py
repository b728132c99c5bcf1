"""Commands that look after the queues as a whole: ``status``, ``sweep``, ``migrate`` and
``metrics``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click

from leaseq import sweeper, validate
from leaseq.browse import SUMMARY_STATUSES
from leaseq.cli import (
    Seconds,
    echo_json,
    errors,
    json_option,
    open_store,
    render,
    url_option,
    warn_of_empty_queues,
)
from leaseq.errors import LeaseqError
from leaseq.job import LIVE_STATUSES
from leaseq.metrics import Metrics, snapshot
from leaseq.signals import StopSignals, stop_event
from leaseq.stores.base import Store


@click.command()
@url_option
@click.option("--queue", "queues", multiple=True, help="Only these queues (repeat).")
@json_option
@errors
def status(url: str | None, queues: tuple[str, ...], as_json: bool) -> None:
    """Jobs by status, ready count (and how many of those a claim limit holds back), in-flight
    count and oldest pending age, per queue."""
    names = [validate.queue_name(queue) for queue in queues]
    with open_store(url, create=False) as store:
        snaps = snapshot(store, names or None)
        warn_of_empty_queues(store, names)
    if as_json:
        echo_json({"url": store.url, "queues": render.status_rows(snaps)})
    else:
        render.console().print(render.status_table(store.url, snaps) if snaps else "no jobs yet")


def _retention(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
               ) -> dict[str, float]:
    rules = {}
    for value in values:
        status, sep, seconds = value.partition("=")
        try:
            rules[status] = float(seconds)
        except ValueError:
            sep = ""
        if not sep or not status:
            raise click.BadParameter(f"expected STATUS=SECONDS (e.g. done=604800), got {value!r}")
        if status in LIVE_STATUSES:
            raise click.BadParameter(f"{status!r} is a live status: retention purges ended jobs "
                                     "(done, failed, cancelled, or an app's own status)")
    return rules


def _warn_of_statuses_no_job_has(store: Store, queues: Sequence[str],
                                 retention: dict[str, float]) -> None:
    """Name on stderr each ``--retain`` status that no job of the queues swept ends with and
    is not one of leaseq's: a typo (``faild=0``) would purge nothing without a word."""
    present = {status for name in (queues or store.queues()) for status in store.counts(name)}
    unknown = sorted(set(retention) - present - set(SUMMARY_STATUSES))
    if unknown:
        click.echo(f"leaseq: no job has status {', '.join(map(repr, unknown))} (is the name "
                   "right?)", err=True)


@click.command()
@url_option
@click.option("--queue", "queues", multiple=True, help="Only these queues (default: all).")
@click.option("--every", "every_s", type=Seconds(0, min_open=True), default=None,
              metavar="S", help="Keep sweeping every S seconds (until SIGTERM / Ctrl-C).")
@click.option("--retain", "retention", multiple=True, callback=_retention,
              metavar="STATUS=SECONDS", help="Purge jobs of STATUS older than SECONDS (repeat).")
@json_option
@errors
def sweep(url: str | None, queues: tuple[str, ...], every_s: float | None,
          retention: dict[str, float], as_json: bool) -> None:
    """Reclaim expired leases in every queue, then purge by retention. Once, or --every S."""
    config = sweeper.SweeperConfig(every_s=every_s or 30.0, retention_s=retention)

    def report(results: list[sweeper.SweepResult]) -> None:
        if as_json:
            click.echo(json.dumps([_as_dict(r) for r in results]))
            return
        for r in results:
            click.echo(f"{r.queue}: reclaimed {r.reclaimed}, expired {r.expired}, "
                       f"purged {r.purged}")
        if not results:
            click.echo("no queues yet")

    with open_store(url) as store:
        _warn_of_statuses_no_job_has(store, queues, retention)
        if every_s is None:
            swept: list[sweeper.SweepResult] = []
            try:
                sweeper.run_once(store, config, queues, on_queue=swept.append)
            except LeaseqError:
                if swept:  # the queues swept, though another failed; then the error
                    report(swept)
                raise
            report(swept)
            return
        with stop_event() as stop:
            sweeper.run_forever(store, config, queues=queues, stop=stop, on_sweep=report)


def _as_dict(result: sweeper.SweepResult) -> dict[str, Any]:
    return {"queue": result.queue, "reclaimed": result.reclaimed, "expired": result.expired,
            "purged": result.purged}


@click.command()
@url_option
@errors
def migrate(url: str | None) -> None:
    """Create or upgrade the store's schema (idempotent)."""
    with open_store(url) as store:
        version = store.migrate()
    click.echo(f"schema version {version} at {store.url}")


@click.command()
@url_option
@click.option("--port", type=click.IntRange(0, 65535), required=True, help="Port to serve on.")
@click.option("--addr", default="0.0.0.0", show_default=True, help="Address to bind.")
@click.option("--queue", "queues", multiple=True, help="Only these queues (default: all).")
@click.option("--refresh-s", type=Seconds(0), default=5.0, show_default=True,
              help="Re-read the store at most this often.")
@errors
def metrics(url: str | None, port: int, addr: str, queues: tuple[str, ...],
            refresh_s: float) -> None:
    """Serve the queue gauges (jobs, ready, oldest pending age) for Prometheus / KEDA."""
    # It creates the store, as a worker does: the exporter is a service started beside the
    # workers (before any, when they scale from zero), not an inspection of a store.
    names = [validate.queue_name(queue) for queue in queues]
    with open_store(url) as store:
        warn_of_empty_queues(store, names)
        registry = Metrics()
        registry.watch_store(store, lambda: names or None, refresh_s)
        registry.watch_schedules(store, refresh_s=refresh_s)
        stop_server = registry.serve(port, addr)
        click.echo(f"serving metrics of {store.url} on http://{addr}:{stop_server.port}/metrics",
                   err=True)
        with StopSignals() as signals:
            signals.wait()
        stop_server()


COMMANDS = [status, sweep, migrate, metrics]
