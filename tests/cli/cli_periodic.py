"""Apps with schedules for the process tests (``leaseq scheduler cli_periodic:app``,
``leaseq worker cli_periodic:app``)."""

from __future__ import annotations

from datetime import datetime

import leaseq

app = leaseq.App()


@app.periodic(every_s=1, queue="beats", catch_up="all")
def beat(tick: datetime) -> str:
    """One job per second, each told its tick."""
    return tick.isoformat()


@app.task(queue="beats")
def ping() -> str:
    """Not periodic: shows that a worker is up and claiming."""
    return "pong"


hourly = leaseq.App()


@hourly.periodic(every_s=3600, queue="hours")
def on_the_hour() -> None:
    """Its scheduler sleeps until the next hour (at most ``max_sleep_s``) between looks."""
