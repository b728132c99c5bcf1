"""Commands on jobs: ``enqueue``, ``inspect``, ``failed``, ``requeue`` (alias ``retry``) and
``cancel``."""

from __future__ import annotations

import itertools
import json
import sys
import uuid
from typing import Any

import click

from leaseq import validate
from leaseq.app import App
from leaseq.cli import (
    Failed,
    Seconds,
    echo_json,
    errors,
    json_option,
    open_store,
    render,
    url_for_app,
    url_option,
    warn_of_empty_queues,
)
from leaseq.errors import JobConflict, JobNotFound
from leaseq.job import EnqueueResult
from leaseq.queue import Queue
from leaseq.stores.base import Store

MAX_LIST = 10_000
PAGE = 500


# --- producers ------------------------------------------------------------------------------


@click.command()
@url_option
@click.option("--queue", default="default", show_default=True)
@click.option("--task", "task_name", required=True, metavar="NAME", help="Task name.")
@click.option("--payload", default=None, metavar="JSON",
              help="The payload, a JSON object. Read from stdin when omitted or '-'.")
@click.option("--job-id", default=None, metavar="ID", help="Stable job id (default: random).")
@click.option("--revision", default=None, metavar="R", help="Version of the input.")
@click.option("--delay-s", type=Seconds(0), default=0.0, help="Not before now + S.")
@click.option("--app", "app_ref", default=None, metavar="MODULE:APP",
              help="Check the payload against the task's signature (and use its queue).")
@json_option
@errors
def enqueue(url: str | None, queue: str, task_name: str, payload: str | None,
            job_id: str | None, revision: str | None, delay_s: float, app_ref: str | None,
            as_json: bool) -> None:
    """Enqueue one job (idempotent by --job-id)."""
    data = _parse_payload(payload)
    # Only a missing --job-id gets a new one: --job-id "$ID" with $ID empty is refused, not a
    # new job on every replay
    job_id = uuid.uuid4().hex if job_id is None else job_id
    try:
        if app_ref:
            queue, result = _enqueue_through_app(app_ref, url, task_name, data, job_id,
                                                 revision, delay_s)
        else:
            with open_store(url) as store:
                result = Queue(store, queue).enqueue(job_id, data, task=task_name,
                                                     revision=revision, delay_s=delay_s)
    except JobConflict as exc:  # its own advice names the Python API's options
        raise Failed(f"queue {exc.queue!r}: job {job_id[:80]!r} already exists with a "
                     "different payload and no revision; nothing was written. Give "
                     "--revision R when the payload is a new version of the job, or another "
                     "--job-id.") from None
    if as_json:
        echo_json({"queue": queue, "job_id": result.job_id, "outcome": result.outcome.value})
    else:
        click.echo(f"{result.outcome.value}: job {result.job_id} in queue {queue}")


def _enqueue_through_app(app_ref: str, url: str | None, task_name: str, data: dict[str, Any],
                         job_id: str, revision: str | None, delay_s: float
                         ) -> tuple[str, EnqueueResult]:
    """Enqueue as the app's task: the payload checked against its signature, into its queue."""
    app = App.from_ref(app_ref)
    url = url_for_app(app, url)
    if url:
        app.use_store(open_store(url))
    task = app.get_task(task_name)
    if task is None:
        raise click.BadParameter(f"the app has no task {task_name!r}", param_hint="--task")
    return task.queue, task.enqueue_payload(data, job_id=job_id, revision=revision,
                                            delay_s=delay_s)


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


@click.command()
@click.argument("job_id", metavar="JOB")
@url_option
@click.option("--queue", default=None, help="The job's queue (found by id when omitted).")
@json_option
@errors
def inspect(job_id: str, url: str | None, queue: str | None, as_json: bool) -> None:
    """Show a job's record and its journal as a story, with how long each attempt ran."""
    with open_store(url, create=False) as store:
        q = find_queue(store, job_id, queue)
        job, entries = q.get(job_id), q.journal(job_id)
        # The clock only for an attempt still running: "running for" reads the server's time.
        now = store.server_now() if job is not None and job.status == "processing" else None
    if job is None:
        raise Failed(f"job {job_id!r} is gone from queue {q.name!r}")
    if as_json:
        echo_json({"job": job.to_dict(), "journal": [e.to_dict() for e in entries],
                   **render.attempt_rows(entries, now)})
        return
    console = render.console()
    console.print(render.record_table(job))
    console.print(f"\n[bold]story of {render.shown(job.id)}[/bold]")
    for line in render.story(entries, now):
        console.print(line, highlight=False)


def find_queue(store: Store, job_id: str, queue: str | None) -> Queue:
    """The queue holding ``job_id``: the one given, or the only queue that has it."""
    job_id = validate.job_id(job_id)
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


@click.command()
@url_option
@click.option("--queue", "queues", multiple=True, help="Only these queues (repeat).")
@click.option("--limit", type=click.IntRange(1, MAX_LIST), default=100, show_default=True)
@json_option
@errors
def failed(url: str | None, queues: tuple[str, ...], limit: int, as_json: bool) -> None:
    """List the quarantine (status failed) with reasons."""
    names = [validate.queue_name(name) for name in queues]
    with open_store(url, create=False) as store:
        warn_of_empty_queues(store, names)
        quarantine = itertools.chain.from_iterable(
            Queue(store, name).iter_jobs("failed", page_size=min(limit, PAGE))
            for name in names or store.queues())
        jobs = list(itertools.islice(quarantine, limit))
    if as_json:
        echo_json(render.quarantine_rows(jobs))
    else:
        render.console().print(render.quarantine_table(jobs))


# --- operators -------------------------------------------------------------------------------


REQUEUE_HELP = "Put a terminal job (or, with --all-failed, the whole quarantine) back to pending."


@click.command(help=REQUEUE_HELP)
@click.argument("job_id", metavar="[JOB]", required=False)
@url_option
@click.option("--queue", default=None, help="The job's queue (found by id when omitted); "
              "with --all-failed, only this queue.")
@click.option("--all-failed", is_flag=True, help="Requeue every job in quarantine.")
@errors
def requeue(job_id: str | None, url: str | None, queue: str | None, all_failed: bool) -> None:
    if bool(job_id) == all_failed:
        raise click.UsageError("give either JOB or --all-failed")
    with open_store(url, create=False) as store:
        if job_id:
            q = find_queue(store, job_id, queue)
            if not q.requeue(job_id):
                raise Failed(f"job {job_id!r} is still pending or processing; "
                             "nothing to requeue")
            click.echo(f"requeued: job {job_id} in queue {q.name} is pending again")
            return
        names = [validate.queue_name(queue)] if queue else []
        warn_of_empty_queues(store, names)
        count = sum(_requeue_failed(Queue(store, name)) for name in names or store.queues())
        click.echo(f"requeued {count} failed job(s)")


def _requeue_failed(queue: Queue) -> int:
    # The ids first: requeuing while paging through "failed" would move the page under us.
    ids = [job.id for job in queue.iter_jobs("failed")]
    return sum(queue.requeue(job_id) for job_id in ids)


# The operator's re-drive was called ``retry``, easy to confuse with ``retry_later`` and
# ``leaseq.Retry``; the old name keeps working for scripts that use it.
def _retry(**options: Any) -> None:
    assert requeue.callback is not None
    requeue.callback(**options)
    # After the work: an error stays the one line every command gives
    click.echo("leaseq: `leaseq retry` is deprecated; use `leaseq requeue`", err=True)


retry = click.Command("retry", callback=_retry, params=requeue.params,
                      help=f"Deprecated: use `leaseq requeue`. {REQUEUE_HELP}",
                      short_help="Deprecated alias of requeue.")


@click.command()
@click.argument("job_id", metavar="JOB")
@url_option
@click.option("--queue", default=None, help="The job's queue (found by id when omitted).")
@errors
def cancel(job_id: str, url: str | None, queue: str | None) -> None:
    """Cancel a pending, processing or failed job (a running attempt is fenced out)."""
    with open_store(url, create=False) as store:
        q = find_queue(store, job_id, queue)
        if not q.cancel(job_id):
            job = q.get(job_id)
            status = job.status if job is not None else "gone"
            raise Failed(f"job {job_id!r} is {status} already; nothing to cancel")
    click.echo(f"cancelled: job {job_id} in queue {q.name}")


COMMANDS = [enqueue, inspect, failed, requeue, retry, cancel]
