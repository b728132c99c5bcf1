"""Periodic jobs: schedules declared in code, ticks enqueued exactly once by any number of
schedulers (docs/periodic.md). ``spec`` says when a schedule ticks, ``plan`` what one look
decides, ``service`` holds the scheduler (config, ``run_once``, the loop)."""

from __future__ import annotations

from typing import Any

from leaseq.scheduler.spec import Schedule

__all__ = ["Schedule", "Scheduler", "SchedulerConfig"]


def __getattr__(name: str) -> Any:
    # The service needs the App, and the App needs Schedule: import the service on first use.
    if name in ("Scheduler", "SchedulerConfig"):
        from leaseq.scheduler import service

        return getattr(service, name)
    raise AttributeError(name)
