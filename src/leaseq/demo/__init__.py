"""``leaseq demo``: a fetch → thumbnail pipeline under real failures, a crash and a replay.

On a fresh SQLite file (or ``--url``): enqueue the fetch jobs, run worker processes, SIGKILL one
while it holds a job and start a replacement, replay a producer batch (it must create nothing),
wait until every job is terminal, then count — from the journal and the effect ledger, not from
what the demo expects — what was done, retried, quarantined, reclaimed, duplicated and lost.

``tasks`` is the pipeline, ``run`` the script a run follows, ``summary`` the count.
"""

from leaseq.demo.run import DemoConfig, DemoRun, run_demo
from leaseq.demo.summary import print_summary, summarize
from leaseq.demo.tasks import build_app

__all__ = ["DemoConfig", "DemoRun", "build_app", "print_summary", "run_demo", "summarize"]
