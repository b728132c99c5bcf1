"""``leaseq demo``: the pipeline demo (see ``leaseq.demo``)."""

from __future__ import annotations

import sys

import click

from leaseq.cli import echo_json, errors, json_option


# Not the shared --url: the demo ignores LEASEQ_URL, so it never writes its jobs into the store
# the shell happens to point at; it uses a fresh file unless told otherwise.
@click.command()
@click.option("--url", default=None, metavar="URL",
              help="Store to use (default: a fresh SQLite file in a temporary folder).")
@click.option("--jobs", "n_jobs", type=click.IntRange(20, 1_000_000), default=2000,
              show_default=True, help="Jobs in the pipeline (fetch + thumbnail).")
@click.option("--workers", type=click.IntRange(2, 64), default=2, show_default=True,
              help="Worker processes (one is SIGKILLed mid-run and replaced).")
@click.option("--keep", is_flag=True, help="Keep the temporary folder (databases, logs).")
@json_option
@errors
def demo(url: str | None, n_jobs: int, workers: int, keep: bool, as_json: bool) -> None:
    """Run the fetch → thumbnail pipeline with failures, a crash and a replay; print a summary."""
    from leaseq.demo import DemoConfig, run_demo

    summary = run_demo(DemoConfig(url=url, jobs=n_jobs, workers=workers, keep=keep,
                                  live=not as_json))
    if as_json:
        echo_json(summary)
    sys.exit(1 if summary["failed_checks"] else 0)


COMMANDS = [demo]
