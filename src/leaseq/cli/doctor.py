"""``leaseq doctor``: the diagnostic map as checks (see ``leaseq.doctor``). Exit status 1 when
a check fails (a warning alone leaves it 0), so a cron job or a CI step can act on it."""

from __future__ import annotations

import click

from leaseq.cli import Failed, Seconds, echo_json, errors, json_option, open_store, url_option
from leaseq.doctor import DoctorConfig, Report, diagnose


@click.command()
@url_option
@click.option("--oldest-ready-s", type=Seconds(0), default=300.0, show_default=True,
              help="Ready work older than this is a finding.")
@click.option("--live-worker-s", type=Seconds(0, min_open=True), default=60.0,
              show_default=True, help="A worker whose last beat is older is not live.")
@click.option("--broker", is_flag=True,
              help="Run the broker checks on every queue (else only where a publish was "
                   "journaled this hour).")
@json_option
@errors
def doctor(url: str | None, oldest_ready_s: float, live_worker_s: float, broker: bool,
           as_json: bool) -> None:
    """Check the queues for the known symptoms: symptom → likely cause → check → action."""
    config = DoctorConfig(live_worker_s=live_worker_s, oldest_ready_s=oldest_ready_s,
                          broker=broker)
    with open_store(url, create=False) as store:
        report = diagnose(store, config)
    if as_json:
        echo_json({"ok": not report.failed, "checks_run": report.checks_run,
                   "findings": [f.to_dict() for f in report.findings]})
    else:
        _print(report)
    if report.failed:
        raise Failed(f"{sum(f.severity == 'fail' for f in report.findings)} check(s) failed")


def _print(report: Report) -> None:
    if not report.findings:
        click.echo(f"healthy: {len(report.checks_run)} check(s) found nothing")
        return
    for f in report.findings:
        where = f" [{f.queue}]" if f.queue else ""
        click.echo(f"{f.severity.upper()} {f.check}{where}\n"
                   f"  symptom: {f.symptom}\n  likely cause: {f.cause}\n"
                   f"  check: {f.ran}\n  action: {f.action}")


COMMANDS = [doctor]
