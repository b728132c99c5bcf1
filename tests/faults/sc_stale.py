"""Scenario 2, stale worker: SIGSTOP a worker holding jobs past their lease, another worker
takes and completes them, SIGCONT → the stale worker's complete, heartbeat and fail change
nothing. The stale writes are also made once more, on purpose, through the API."""

from __future__ import annotations

import signal
import time

from leaseq import LeaseLost
from leaseq.testing.chaos import Run, settle, wait_until

LEASE_S = 2.0


def run(r: Run) -> None:
    n = r.size(20, 200)
    store = r.open()
    q = store.queue("chaos", lease_s=LEASE_S)
    ids = [f"stale-{i:04d}" for i in range(n)]
    # A third of each: complete when held long enough, fail, or watch the heartbeat.
    plans = [(i, {"n": k, "hold_s": 2.0, "watch": k % 3 == 2,
                  "then": "fail" if k % 3 == 1 else "complete"}) for k, i in enumerate(ids)]
    q.enqueue_many([q.spec(i, p, task="hold") for i, p in plans])
    ledger = r.ledger()
    stale = r.worker("stale", concurrency=n, env={"CHAOS_LEASE_S": str(LEASE_S)}).start()
    # The crash point: every job claimed and its effect written (so the stop never lands in
    # a ledger write), every handler in its hold.
    held = wait_until(lambda: q.counts().get("processing", 0) == n
                      and len(ledger.effects()) == n, 60, 0.02)
    stale.signal(signal.SIGSTOP)
    r.check("the stale worker held every job when stopped", held, str(q.counts()))
    old = {j.id: j for j in (q.get(i) for i in ids) if j is not None}
    # Past its lease on the database clock, another worker takes every job and completes it.
    wait_until(lambda: q.ready() == n, 30, 0.1)
    taken = []
    while len(taken) < n and (batch := q.claim("rescuer", n, lease_s=60)):
        taken += batch
    r.check("the rescuer took every job", len(taken) == n, f"{len(taken)} of {n}")
    for job in taken:
        ledger.record(job, "work", "rescuer")
        q.complete(job, {"n": job.payload["n"], "by": "rescuer"})
    after_rescue = {j.id: j for j in (q.get(i) for i in ids) if j is not None}
    stale.signal(signal.SIGCONT)
    # Let the stale worker wake up, beat and try to finish; then stop it.
    time.sleep(LEASE_S + 0.5)
    stale.stop()
    # Each stale job either had its write refused ("lease lost"), or was abandoned by the
    # worker's local lease clock on waking (issue 14) and never written at all.
    output = stale.output()
    refused_by_worker = output.count("lease lost")
    abandoned = output.count("; abandoned")
    refused, accepted = _stale_writes_through_api(q, old)
    final = settle(r, q, ids, ledger, reruns_allowed=True)
    changed = [i for i in ids if final[i] != after_rescue[i]]
    r.counts.stale_refused = refused + refused_by_worker
    r.counts.stale_accepted = accepted + len(changed)
    r.check("the stale worker's writes were refused or never made (its log says lease lost "
            "or abandoned)",
            refused_by_worker + abandoned >= n,
            f"{refused_by_worker} refused and {abandoned} abandoned of {n}")
    r.check("stale complete / heartbeat / fail through the API refused", accepted == 0,
            f"{accepted} accepted")
    r.check("records unchanged after the rescue", not changed, f"{changed[:5]}")
    r.check("every job done by the rescuer",
            all(final[i].status == "done" and final[i].result["by"] == "rescuer" for i in ids),
            str({final[i].status for i in ids}))
    journal = [e for i in ids for e in q.journal(i) if e.lease_epoch == old[i].lease_epoch
               and e.event in ("result_saved", "quarantined", "snoozed", "given_back",
                                 "retry_scheduled")]
    r.check("no state change journaled under the stale epoch", not journal, str(journal[:3]))


def _stale_writes_through_api(q, old) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    refused = accepted = 0
    for job in old.values():
        lost = q.heartbeat([job], lease_s=60)
        refused, accepted = (refused + 1, accepted) if lost else (refused, accepted + 1)
        for write in (lambda j=job: q.complete(j, {"by": "stale"}),
                      lambda j=job: q.fail(j, "stale", "permanent"),
                      lambda j=job: q.retry_later(j, "stale", 0),
                      lambda j=job: q.snooze(j, 0)):
            try:
                write()
            except LeaseLost:
                refused += 1
            else:
                accepted += 1
    return refused, accepted
