"""The app of the periodic scenario (``leaseq worker chaos_periodic:app``): one schedule
every second, every missed tick caught up, each run recorded in the effects ledger."""

from __future__ import annotations

import os
from datetime import datetime

from leaseq import App, Job
from leaseq.testing.chaos import Ledger

app = App(queues={"periodic": {"lease_s": 2.0, "heartbeat_every_s": 0.5,
                               "backoff_base_s": 0.05, "backoff_cap_s": 0.2}})
_ledger: Ledger | None = None


@app.periodic(every_s=1, catch_up="all", queue="periodic", max_attempts=10)
def beat(job: Job, tick: datetime) -> str:
    """One effect per tick; a worker killed around it makes a fenced re-run at worst."""
    global _ledger
    if _ledger is None:
        _ledger = Ledger(os.environ["CHAOS_EFFECTS"])
    _ledger.record(job, "beat", f"pid{os.getpid()}")
    return tick.isoformat()
