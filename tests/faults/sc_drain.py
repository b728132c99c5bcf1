"""Scenario 10, SIGTERM drain: a worker with 200 jobs in flight is told to stop → the jobs that
fit in the grace period finish, the rest are given back; nothing is left ``processing`` after
the grace period, and a second worker finishes the given-back ones with 0 duplicate effects."""

from __future__ import annotations

import os
import time

from leaseq.testing.chaos import Run, all_terminal, settle, wait_until

GRACE_S = 4.0
LEASE_S = 30.0  # long: a job left processing would show, not be reclaimed behind our back


def run(r: Run) -> None:
    n = r.size(200, 2000)
    slow = max(n // 10, 1)  # these outlast the grace period and must be given back
    store = r.open()
    q = store.queue("chaos", lease_s=LEASE_S)
    ids = [f"drain-{i:05d}" for i in range(n)]
    q.enqueue_many([q.spec(i, {"n": k, "seconds": 60.0 if k < slow else 1.0}, task="drain")
                    for k, i in enumerate(ids)])
    ledger = r.ledger()
    env = {"CHAOS_LEASE_S": str(LEASE_S), "CHAOS_HEARTBEAT_S": "1"}
    starts = os.path.join(r.folder, "drain-starts")
    os.makedirs(starts, exist_ok=True)
    first = r.worker("first", concurrency=n, grace_s=GRACE_S,
                     env={**env, "CHAOS_DRAIN_STARTS": starts}).start()
    # Every handler has started (claimed is not enough: a job claimed but not started when
    # the stop comes goes back free at once, and would count as given back here)
    in_flight = wait_until(lambda: len(os.listdir(starts)) == n, 60, 0.05)
    r.check(f"{n} jobs in flight before SIGTERM", in_flight,
            f"{len(os.listdir(starts))} started; {q.counts()}")
    stopped_at = time.monotonic()
    status = first.stop(timeout_s=GRACE_S + 30)
    took = time.monotonic() - stopped_at
    counts = q.counts()
    r.log("drained", status=status, seconds=took, counts=counts)
    r.check("worker exited 0 after SIGTERM", status == 0, f"exit status {status}")
    r.check("nothing left processing after the grace period",
            counts.get("processing", 0) == 0, str(counts))
    r.check("the slow jobs were given back (pending)", counts.get("pending", 0) == slow,
            str(counts))
    # A second worker whose handlers do not dawdle finishes the given-back jobs.
    second = r.worker("second", concurrency=slow, env={**env, "CHAOS_DRAIN_FAST": "1"},
                      extra=["--burst"])
    second.start()
    second.wait(r.size(60, 300))
    r.check("given-back jobs finished by a second worker",
            wait_until(all_terminal(q, ids), 30, 0.2), str(q.counts()))
    second.stop()
    settle(r, q, ids, ledger, reruns_allowed=False)
