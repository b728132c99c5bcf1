"""``leaseq schedules`` (list, ``trigger``, ``pause``, ``resume``) reads and steers the schedule
ledger with no app loaded: the ledger keeps each schedule's spec. ``leaseq scheduler
MODULE:APP`` runs the scheduler alone (workers run one too unless ``--no-scheduler``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click
from rich.table import Table

from leaseq.app import App
from leaseq.cli import (
    app_url_option,
    echo_json,
    errors,
    json_option,
    log_level_option,
    open_store,
    render,
    setup_logging,
    url_for_app,
    url_option,
)
from leaseq.errors import LeaseqError
from leaseq.ledger import ScheduleState, format_tick
from leaseq.scheduler.spec import Schedule
from leaseq.signals import stop_event
from leaseq.stores.base import Store


@click.group(invoke_without_command=True)
@url_option
@json_option
@click.pass_context
@errors
def schedules(ctx: click.Context, url: str | None, as_json: bool) -> None:
    """The schedules in the ledger: spec, zone, next and last tick, last job, paused."""
    ctx.obj = {"url": url, "json": as_json}
    if ctx.invoked_subcommand is not None:
        return
    with open_store(url, create=False) as store:
        rows = _rows(store)
    if as_json:
        echo_json({"url": store.url, "schedules": rows})
    else:
        render.console().print(_table(rows) if rows else "no schedules in the ledger")


def _rows(store: Store) -> list[dict[str, Any]]:
    states = store.schedules()
    if not states:
        return []  # the store's clock is read only when there is a schedule to show
    now = store.server_now()
    return [_row(store, state, now) for state in states]


def _row(store: Store, state: ScheduleState, now: datetime) -> dict[str, Any]:
    try:
        schedule: Schedule | None = Schedule.from_ledger(state.name, state.queue,
                                                         state.spec_json)
    except LeaseqError:  # written by another version of the code: show what is known
        schedule = None
    job = store.get(state.queue, state.last_job_id) if state.last_job_id else None
    upcoming = (schedule.next_after(max(state.cursor, now)) if schedule and state.ticking
                else None)
    return {
        "name": state.name, "queue": state.queue,
        "spec": schedule.describe() if schedule else "?",
        "timezone": schedule.timezone if schedule else "?",
        "catch_up": schedule.catch_up if schedule else "?",
        "overlap": schedule.overlap if schedule else "?",
        "next_tick": format_tick(upcoming) if upcoming else None,
        "last_tick": format_tick(state.last_tick) if state.last_tick else None,
        "last_job": state.last_job_id, "last_job_status": job.status if job else None,
        "skipped": state.skipped, "paused": state.paused, "active": state.active,
    }


def _table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="schedules", title_justify="left")
    table.add_column("name", no_wrap=True)
    for column in ("spec", "next tick", "last tick", "last job", "state"):
        table.add_column(column, overflow="fold")
    for row in rows:
        zone = "" if row["timezone"] in ("UTC", "?") else f" ({row['timezone']})"
        job = f"{row['last_job']} ({row['last_job_status'] or 'purged'})" \
            if row["last_job"] else "-"
        table.add_row(render.shown(row["name"]), render.shown(row["spec"] + zone),
                      row["next_tick"] or "-", row["last_tick"] or "-", render.shown(job),
                      _state_words(row))
    return table


def _state_words(row: dict[str, Any]) -> str:
    words = "inactive" if not row["active"] else "paused" if row["paused"] else "active"
    return words + (f", {row['skipped']} skipped" if row["skipped"] else "")


@schedules.command()
@click.argument("name")
@url_option
@json_option
@click.pass_context
@errors
def trigger(ctx: click.Context, name: str, url: str | None, as_json: bool) -> None:
    """Enqueue one job of NAME now (journaled as a manual tick; its ticks are unchanged)."""
    from leaseq.scheduler.service import trigger as trigger_now

    ctx = _options(ctx, url, as_json)
    with open_store(ctx.obj["url"], create=False) as store:
        job_id = trigger_now(store, name)
    _say(ctx, {"schedule": name, "job": job_id}, f"enqueued {job_id}")


@schedules.command()
@click.argument("name")
@url_option
@json_option
@click.pass_context
@errors
def pause(ctx: click.Context, name: str, url: str | None, as_json: bool) -> None:
    """Pause NAME: no tick fires until it is resumed."""
    _pause(_options(ctx, url, as_json), name, True)


@schedules.command()
@click.argument("name")
@url_option
@json_option
@click.pass_context
@errors
def resume(ctx: click.Context, name: str, url: str | None, as_json: bool) -> None:
    """Resume NAME: ticks after now fire; those of the pause do not."""
    _pause(_options(ctx, url, as_json), name, False)


@schedules.command()
@click.argument("name")
@url_option
@json_option
@click.pass_context
@errors
def history(ctx: click.Context, name: str, url: str | None, as_json: bool) -> None:
    """NAME's own journal: registered, changed, paused, resumed, ticks skipped or missed,
    manual ticks, from every queue it was in (each tick's job has its own: leaseq inspect
    JOB)."""
    from leaseq.scheduler.service import history as schedule_history

    ctx = _options(ctx, url, as_json)
    with open_store(ctx.obj["url"], create=False) as store:
        entries = schedule_history(store, name)
    if ctx.obj["json"]:
        echo_json({"schedule": name, "journal": [e.to_dict() for e in entries]})
    else:
        for line in render.schedule_story(entries) or ["no events"]:
            render.console().print(line)


def _options(ctx: click.Context, url: str | None, as_json: bool) -> click.Context:
    """``--url`` and ``--json`` given after the subcommand win over those before it."""
    ctx.obj = {"url": url or ctx.obj["url"], "json": as_json or ctx.obj["json"]}
    return ctx


def _pause(ctx: click.Context, name: str, paused: bool) -> None:
    from leaseq.scheduler.service import set_paused

    with open_store(ctx.obj["url"], create=False) as store:
        changed = set_paused(store, name, paused)
    word = "paused" if paused else "resumed"
    _say(ctx, {"schedule": name, "paused": paused, "changed": changed},
         f"{name} {word}" if changed else f"{name} was already {word}")


def _say(ctx: click.Context, value: dict[str, Any], text: str) -> None:
    if ctx.obj["json"]:
        echo_json(value)
    else:
        click.echo(text)


@click.command()
@click.argument("app_ref", metavar="MODULE:APP")
@app_url_option
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve the schedule gauges for Prometheus here.")
@log_level_option("info")
@errors
def scheduler(app_ref: str, url: str | None, metrics_port: int | None, log_level: str) -> None:
    """Run only the scheduler of the App at MODULE:APP (until SIGTERM / Ctrl-C)."""
    from leaseq.scheduler.service import Scheduler

    setup_logging(log_level)
    app = App.from_ref(app_ref)
    url = url_for_app(app, url)
    if url:
        app.use_store(open_store(url))
    if not app.schedules:
        # Its schedules' removal still stands: those left in the ledger for its queues are
        # marked inactive (as a worker's scheduler does), then there is nothing to run.
        Scheduler(app).register()
        raise click.UsageError(f"{app_ref} declares no schedules (@app.periodic, app.schedule); "
                               "any left in the ledger for its queues are marked inactive")
    stop_server = _serve_metrics(app.store, metrics_port)
    try:
        with stop_event() as stop:
            Scheduler(app).run(stop)
    finally:
        stop_server()


def _serve_metrics(store: Store, port: int | None) -> Any:
    if port is None:
        return lambda: None
    from leaseq.metrics import Metrics

    registry = Metrics()
    registry.watch_schedules(store)
    return registry.serve(port)


COMMANDS = [schedules, scheduler]
