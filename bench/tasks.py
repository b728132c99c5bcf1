"""The benchmark's leaseq app: one no-op task, run by ``leaseq worker bench.tasks:app``.

The store comes from ``LEASEQ_URL`` (or the worker's ``--url``), so importing this module
opens nothing.
"""

from __future__ import annotations

from bench.systems import record_start
from leaseq.app import App

#: The queue every leaseq scenario uses.
QUEUE = "bench"
#: The task name the scenarios enqueue with.
TASK = "noop"

app = App()


@app.task(name=TASK, queue=QUEUE)
def noop(i: int) -> None:
    """Does nothing but note its start time when the latency scenario asks for it."""
    record_start(i)
