"""The ``leaseq`` command line: workers, producers, inspection, upkeep, metrics and the demo.

Exit status: 0 success, 1 the database could not be used (or the job does not exist), 2 bad
arguments (with a usage message). Human output is rich tables; ``--json`` is for machines.
"""

from __future__ import annotations

import functools
import json
import logging
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from leaseq import sweeper
from leaseq.errors import InvalidInput, InvalidURL, JobNotFound, LeaseqError
from leaseq.job import Job, JournalEntry
from leaseq.metrics import Metrics, snapshot
from leaseq.queue import Queue
from leaseq.stores import DEFAULT_URL, connect
from leaseq.stores.base import Store

MAX_LIST = 10_000


class Failed(click.ClickException):
    """The command could not do its work (exit 1): one clear line on stderr."""

    def show(self, file: Any = None) -> None:
        click.echo(f"leaseq: {self.format_message()}", err=True)


def _errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Map leaseq's typed errors to exit codes: bad input → usage (2), the rest → 1."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except LeaseqError as exc:
            # A URL that cannot be used is a database problem (1), not a usage error (2).
            if isinstance(exc, InvalidInput) and not isinstance(exc, InvalidURL):
                raise click.UsageError(str(exc), click.get_current_context()) from None
            raise Failed(str(exc)) from None
    return wrapper


def url_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--url", envvar="LEASEQ_URL", default=None, metavar="URL",
                        help=f"Store URL (env LEASEQ_URL; default {DEFAULT_URL}).")(func)


def json_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Machine output.")(func)


def _store(url: str | None) -> Store:
    return connect(url)


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="leaseq")
def cli() -> None:
    """leaseq: a durable job queue whose database record is the job's state."""


# --- worker ---------------------------------------------------------------------------------


@cli.command()
@click.argument("app_ref", metavar="MODULE:APP")
@url_option
@click.option("--queue", "queues", multiple=True, help="Queue to serve (repeat). "
              "Default: every queue the app's tasks use.")
@click.option("--concurrency", type=click.IntRange(1, 10_000), default=10, show_default=True,
              help="Jobs in flight per process.")
@click.option("--processes", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Worker processes (each with --concurrency slots).")
@click.option("--burst", is_flag=True, help="Exit 0 once nothing is claimable or in flight.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics here (process i of --processes uses PORT+i).")
@click.option("--grace-s", type=click.FloatRange(0), default=30.0, show_default=True,
              help="On SIGTERM, how long in-flight jobs may finish before being given back.")
@click.option("--sweep-every-s", type=click.FloatRange(0, min_open=True), default=30.0,
              show_default=True, help="How often to reclaim expired leases.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
@click.option("--delivery", type=click.Choice(["poll", "rabbitmq"]), default="poll",
              show_default=True, help="poll: claim from the store; rabbitmq: take deliveries "
              "from RabbitMQ (fed by `leaseq dispatch`).")
@click.option("--amqp-url", envvar="LEASEQ_AMQP_URL", default=None, metavar="URL",
              help="RabbitMQ URL for --delivery rabbitmq (or LEASEQ_AMQP_URL).")
@_errors
def worker(app_ref: str, url: str | None, queues: tuple[str, ...], concurrency: int,
           processes: int, burst: bool, metrics_port: int | None, grace_s: float,
           sweep_every_s: float, log_level: str, delivery: str, amqp_url: str | None) -> None:
    """Run the tasks of the App at MODULE:APP (e.g. myproject.tasks:app)."""
    from leaseq.supervisor import load_app, run_processes, run_worker
    from leaseq.worker import WorkerConfig

    level = getattr(logging, log_level.upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if delivery == "rabbitmq":
        _consume(app_ref, url, amqp_url, queues, concurrency, grace_s, burst, processes)
        return
    config = WorkerConfig(queues=queues, concurrency=concurrency, burst=burst,
                          grace_s=grace_s, sweep_every_s=sweep_every_s,
                          metrics_port=metrics_port)
    load_app(app_ref)  # a bad MODULE:APP is a usage error, before anything starts
    if processes == 1:
        code = run_worker(app_ref, url, config)
    else:
        code = run_processes(app_ref, url, config, processes, level)
    sys.exit(code)


def _consume(app_ref: str, url: str | None, amqp_url: str | None, queues: tuple[str, ...],
             concurrency: int, grace_s: float, burst: bool, processes: int) -> None:
    """``--delivery rabbitmq``: the same tasks and outcomes, deliveries pushed by RabbitMQ."""
    from leaseq.delivery.rabbitmq import run_app_consumer
    from leaseq.supervisor import load_app

    if not amqp_url:
        raise click.UsageError("--delivery rabbitmq needs --amqp-url (or LEASEQ_AMQP_URL)")
    if burst or processes != 1:
        raise click.UsageError("--delivery rabbitmq runs one process and has no --burst; "
                               "start more consumers to scale out")
    run_app_consumer(load_app(app_ref), amqp_url, queues=queues,
                     store=connect(url) if url else None, concurrency=concurrency,
                     grace_s=grace_s)


# --- producers ------------------------------------------------------------------------------


@cli.command()
@url_option
@click.option("--queue", default="default", show_default=True)
@click.option("--task", "task_name", required=True, metavar="NAME", help="Task name.")
@click.option("--payload", default=None, metavar="JSON",
              help="The payload, a JSON object. Read from stdin when omitted or '-'.")
@click.option("--job-id", default=None, metavar="ID", help="Stable job id (default: random).")
@click.option("--revision", default=None, metavar="R", help="Version of the input.")
@click.option("--delay-s", type=click.FloatRange(0), default=0.0, help="Not before now + S.")
@click.option("--app", "app_ref", default=None, metavar="MODULE:APP",
              help="Check the payload against the task's signature (and use its queue).")
@json_option
@_errors
def enqueue(url: str | None, queue: str, task_name: str, payload: str | None,
            job_id: str | None, revision: str | None, delay_s: float, app_ref: str | None,
            as_json: bool) -> None:
    """Enqueue one job (idempotent by --job-id)."""
    data = _parse_payload(payload)
    job_id = job_id or uuid.uuid4().hex
    if app_ref:
        from leaseq.supervisor import load_app

        app = load_app(app_ref)
        if url:
            app.use_store(connect(url))
        task = app.get_task(task_name)
        if task is None:
            raise click.BadParameter(f"the app has no task {task_name!r}", param_hint="--task")
        queue = task.queue
        result = task.enqueue_payload(data, job_id=job_id, revision=revision, delay_s=delay_s)
    else:
        with _store(url) as store:
            result = Queue(store, queue).enqueue(job_id, data, task=task_name,
                                                 revision=revision, delay_s=delay_s)
    if as_json:
        _echo_json({"queue": queue, "job_id": result.job_id, "outcome": result.outcome.value})
    else:
        click.echo(f"{result.outcome.value}: job {result.job_id} in queue {queue}")


def _parse_payload(text: str | None) -> dict[str, Any]:
    if text is None or text == "-":
        text = sys.stdin.read()
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from None
    except RecursionError:
        raise click.BadParameter("nested too deeply to store", param_hint="--payload") from None
    if not isinstance(data, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--payload")
    return data


# --- inspection -----------------------------------------------------------------------------


@cli.command()
@url_option
@click.option("--queue", "queues", multiple=True, help="Only these queues (repeat).")
@json_option
@_errors
def status(url: str | None, queues: tuple[str, ...], as_json: bool) -> None:
    """Jobs by status, ready count and oldest pending age, per queue."""
    with _store(url) as store:
        snaps = snapshot(store, list(queues) or None)
    if as_json:
        _echo_json({"url": store.url, "queues": {
            s.queue: {"counts": s.counts, "ready": s.ready,
                      "oldest_pending_age_s": round(s.oldest_pending_age_s, 3)}
            for s in snaps}})
        return
    table = Table(title=f"leaseq — {store.url}")
    statuses = ["pending", "processing", "done", "failed", "cancelled"]
    others = sorted({k for s in snaps for k in s.counts} - set(statuses))
    for column in ["queue", *statuses, *others, "ready", "oldest pending"]:
        table.add_column(column, justify="left" if column == "queue" else "right")
    for s in snaps:
        table.add_row(s.queue, *(str(s.counts.get(k, 0)) for k in [*statuses, *others]),
                      str(s.ready), f"{s.oldest_pending_age_s:.1f} s")
    Console().print(table if snaps else "no jobs yet")


@cli.command()
@click.argument("job_id", metavar="JOB")
@url_option
@click.option("--queue", default=None, help="The job's queue (found by id when omitted).")
@json_option
@_errors
def inspect(job_id: str, url: str | None, queue: str | None, as_json: bool) -> None:
    """Show a job's record and its journal as a story."""
    with _store(url) as store:
        q = _find(store, job_id, queue)
        job, entries = q.get(job_id), q.journal(job_id)
    if job is None:
        raise Failed(f"job {job_id!r} is gone from queue {q.name!r}")
    if as_json:
        _echo_json({"job": job.to_dict(), "journal": [e.to_dict() for e in entries]})
        return
    console = Console()
    console.print(_record_table(job))
    console.print(f"\n[bold]story of {job.id}[/bold]")
    start = entries[0].at if entries else None
    for entry in entries:
        console.print(_story_line(entry, start), highlight=False)


def _find(store: Store, job_id: str, queue: str | None) -> Queue:
    """The queue holding ``job_id``: the one given, or the only queue that has it."""
    if queue is not None:
        q = Queue(store, queue)
        if q.get(job_id) is None:
            raise JobNotFound(queue, job_id)
        return q
    holders = [Queue(store, name) for name in store.queues()
               if store.get(name, job_id) is not None]
    if not holders:
        raise Failed(f"no queue has a job {job_id[:200]!r}")
    if len(holders) > 1:
        names = ", ".join(q.name for q in holders)
        raise click.UsageError(f"job {job_id!r} is in several queues ({names}); pass --queue")
    return holders[0]


def _record_table(job: Job) -> Table:
    table = Table(show_header=False, title=f"job {job.id}", title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for name, value in job.to_dict().items():
        if name == "payload":
            value = f"{len(json.dumps(value))} bytes, keys: {', '.join(sorted(value)) or '-'}"
        if value not in (None, "", False) or name in ("status", "attempts"):
            table.add_row(name, str(value))
    return table


_EVENT_WORDS = {
    "enqueued": "enqueued", "claimed": "claimed", "heartbeat_lost": "lost its lease",
    "result_saved": "finished", "retry_scheduled": "will be retried", "snoozed": "snoozed",
    "quarantined": "quarantined", "reclaimed": "lease expired, back in the queue",
    "retried": "retried by an operator", "cancelled": "cancelled", "published": "published",
    "received": "delivered", "ack_sent": "acknowledged",
}


def _story_line(entry: JournalEntry, start: datetime | None) -> str:
    offset = (entry.at - start).total_seconds() if start else 0.0
    words = _EVENT_WORDS.get(entry.event, entry.event)
    parts = [f"{entry.at:%H:%M:%S.%f}"[:-3], f"+{offset:7.3f}s", f"[bold]{words}[/bold]"]
    if entry.attempt:
        parts.append(f"attempt {entry.attempt}")
    if entry.worker_id:
        parts.append(f"by {entry.worker_id}")
    detail = entry.reason or ""
    if entry.data and "delay_s" in entry.data:
        detail += f" (in {float(entry.data['delay_s']):.2f} s)"
    if detail:
        parts.append(f"— {detail}")
    return "  ".join(parts)


@cli.command()
@url_option
@click.option("--queue", "queues", multiple=True, help="Only these queues (repeat).")
@click.option("--limit", type=click.IntRange(1, MAX_LIST), default=100, show_default=True)
@json_option
@_errors
def failed(url: str | None, queues: tuple[str, ...], limit: int, as_json: bool) -> None:
    """List the quarantine (status failed) with reasons."""
    with _store(url) as store:
        jobs = [j for name in (queues or store.queues())
                for j in _all(Queue(store, name), "failed", limit)][:limit]
    if as_json:
        _echo_json([{"queue": j.queue, "job_id": j.id, "task": j.task, "failure": j.failure,
                     "attempts": j.attempts, "error": j.error,
                     "updated_at": j.updated_at.isoformat() if j.updated_at else None}
                    for j in jobs])
        return
    table = Table(title=f"quarantine: {len(jobs)} job(s)")
    for column in ("queue", "job", "task", "reason", "attempts", "error"):
        table.add_column(column, overflow="fold")
    for j in jobs:
        last_line = (j.error or "").strip().splitlines()[-1:] or [""]
        table.add_row(j.queue, j.id, j.task or "", j.failure or "", str(j.attempts),
                      last_line[0][:200])
    Console().print(table)


def _all(queue: Queue, status: str, limit: int) -> Iterator[Job]:
    """Every job of ``status`` in the queue, paged by id, at most ``limit``."""
    after: str | None = None
    seen = 0
    while seen < limit:
        page = queue.list(status, min(500, limit - seen), after)
        if not page:
            return
        yield from page
        seen += len(page)
        after = page[-1].id


# --- operators -------------------------------------------------------------------------------


@cli.command()
@click.argument("job_id", metavar="JOB", required=False)
@url_option
@click.option("--queue", default=None, help="The job's queue (found by id when omitted); "
              "with --all-failed, only this queue.")
@click.option("--all-failed", is_flag=True, help="Retry every job in quarantine.")
@_errors
def retry(job_id: str | None, url: str | None, queue: str | None, all_failed: bool) -> None:
    """Put a terminal job (or, with --all-failed, the whole quarantine) back to pending."""
    if bool(job_id) == all_failed:
        raise click.UsageError("give either JOB or --all-failed")
    with _store(url) as store:
        if job_id:
            q = _find(store, job_id, queue)
            if not q.retry(job_id):
                raise Failed(f"job {job_id!r} is still pending or processing; nothing to retry")
            click.echo(f"retried: job {job_id} in queue {q.name} is pending again")
            return
        count = 0
        for name in [queue] if queue else store.queues():
            q = Queue(store, name)
            ids = [j.id for j in _all(q, "failed", MAX_LIST * 100)]
            count += sum(q.retry(i) for i in ids)
        click.echo(f"retried {count} failed job(s)")


@cli.command()
@click.argument("job_id", metavar="JOB")
@url_option
@click.option("--queue", default=None, help="The job's queue (found by id when omitted).")
@_errors
def cancel(job_id: str, url: str | None, queue: str | None) -> None:
    """Cancel a pending, processing or failed job (a running attempt is fenced out)."""
    with _store(url) as store:
        q = _find(store, job_id, queue)
        if not q.cancel(job_id):
            raise Failed(f"job {job_id!r} has already finished; nothing to cancel")
    click.echo(f"cancelled: job {job_id} in queue {q.name}")


# --- upkeep ------------------------------------------------------------------------------------


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
    return rules


@cli.command()
@url_option
@click.option("--queue", "queues", multiple=True, help="Only these queues (default: all).")
@click.option("--every", "every_s", type=click.FloatRange(0, min_open=True), default=None,
              metavar="S", help="Keep sweeping every S seconds (until SIGTERM / Ctrl-C).")
@click.option("--retain", "retention", multiple=True, callback=_retention,
              metavar="STATUS=SECONDS", help="Purge jobs of STATUS older than SECONDS (repeat).")
@json_option
@_errors
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

    with _store(url) as store:
        if every_s is None:
            report(sweeper.run_once(store, config, queues))
            return
        with _until_signal():
            sweeper.run_forever(store, config, queues=queues, on_sweep=report)


def _as_dict(result: sweeper.SweepResult) -> dict[str, Any]:
    return {"queue": result.queue, "reclaimed": result.reclaimed, "expired": result.expired,
            "purged": result.purged}


class _Stopped(Exception):
    """Raised by the SIGTERM / SIGINT handler of a long-running command."""


@contextmanager
def _until_signal() -> Iterator[None]:
    """Run the block until SIGTERM / SIGINT. The handler raises instead of setting an Event:
    a signal handler runs on the main thread between two bytecodes, possibly while that
    thread holds the very lock ``Event.set`` would take."""
    def stop(signum: int, frame: Any) -> None:
        raise _Stopped

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    except _Stopped:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@cli.command()
@url_option
@_errors
def migrate(url: str | None) -> None:
    """Create or upgrade the store's schema (idempotent)."""
    with _store(url) as store:
        version = store.migrate()
    click.echo(f"schema version {version} at {store.url}")


@cli.command()
@url_option
@click.option("--port", type=click.IntRange(0, 65535), required=True, help="Port to serve on.")
@click.option("--addr", default="0.0.0.0", show_default=True, help="Address to bind.")
@click.option("--queue", "queues", multiple=True, help="Only these queues (default: all).")
@click.option("--refresh-s", type=click.FloatRange(0), default=5.0, show_default=True,
              help="Re-read the store at most this often.")
@_errors
def metrics(url: str | None, port: int, addr: str, queues: tuple[str, ...],
            refresh_s: float) -> None:
    """Serve the queue gauges (jobs, ready, oldest pending age) for Prometheus / KEDA."""
    store = _store(url)
    registry = Metrics()
    registry.watch_store(store, lambda: list(queues) or None, refresh_s)
    stop_server = registry.serve(port, addr)
    click.echo(f"serving metrics of {store.url} on http://{addr}:{port}/metrics", err=True)
    with _until_signal():
        while True:
            time.sleep(3600)
    stop_server()
    store.close()


# --- demo --------------------------------------------------------------------------------------


@cli.command()
@click.option("--url", default=None, metavar="URL",
              help="Store to use (default: a fresh SQLite file in a temporary folder).")
@click.option("--jobs", "n_jobs", type=click.IntRange(20, 1_000_000), default=2000,
              show_default=True, help="Jobs in the pipeline (fetch + thumbnail).")
@click.option("--workers", type=click.IntRange(2, 64), default=2, show_default=True,
              help="Worker processes (one is SIGKILLed mid-run and replaced).")
@click.option("--keep", is_flag=True, help="Keep the temporary folder (databases, logs).")
@json_option
@_errors
def demo(url: str | None, n_jobs: int, workers: int, keep: bool, as_json: bool) -> None:
    """Run the fetch → thumbnail pipeline with failures, a crash and a replay; print a summary."""
    from leaseq.demo import DemoConfig, run_demo

    summary = run_demo(DemoConfig(url=url, jobs=n_jobs, workers=workers, keep=keep,
                                  live=not as_json))
    if as_json:
        _echo_json(summary)
    sys.exit(0 if summary["lost"] == 0 and summary["duplicate_effects"] == 0 else 1)


def _broker_commands() -> None:
    # The broker commands import pika only when run, so the core install stays light.
    from leaseq.delivery.cli import dispatch, rabbitmq

    cli.add_command(dispatch)
    cli.add_command(rabbitmq)


_broker_commands()


def main() -> None:
    cli(prog_name="leaseq")


if __name__ == "__main__":
    main()
