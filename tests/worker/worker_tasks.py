"""Tasks for the tests that run ``leaseq worker worker_tasks:app`` as a real process.

The store URL comes from ``--url``. Each attempt of ``hang_first`` touches ``{marker}.{attempt}``
so a test knows the attempt has started before it sends a signal.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import leaseq

#: Short, so a killed worker's job comes back soon, and long enough that a busy machine's
#: stalled heartbeat thread (beats every 0.2 s) never runs the lease clock out (at lease - 1 s
#: margin): a job leaves only the way a test means it to.
LEASE_S = 3.0

app = leaseq.App(queues={"work": {"lease_s": LEASE_S, "heartbeat_every_s": 0.2,
                                  "backoff_base_s": 0.0, "backoff_cap_s": 0.0}})


@app.task(queue="work")
def hang_first(marker: str, seconds: float, job: leaseq.Job) -> dict:
    """Attempt 1 blocks for ``seconds``; later attempts finish at once."""
    Path(f"{marker}.{job.attempt}").touch()
    if job.attempt == 1:
        time.sleep(seconds)
    return {"attempt": job.attempt, "pid": os.getpid()}


@app.task(queue="work")
def quick(n: int) -> int:
    return n


@app.task(queue="work")
def crash(code: int) -> None:
    os._exit(code)


@app.task(queue="work")
def long_job(starts: str, n: int, seconds: float) -> None:
    """Appends ``n <wall clock>`` to ``starts`` as it starts, then holds its slot."""
    with open(starts, "a") as f:
        f.write(f"{n} {time.time():.6f}\n")
    time.sleep(seconds)
