"""Scenario 3, heartbeat starvation: handlers that block (sleep, a CPU loop, C calls holding
the GIL) for 3× the heartbeat interval but less than the lease → 0 reclaims: the heartbeat
thread keeps every lease alive."""

from __future__ import annotations

import threading

from leaseq.testing.chaos import Run, all_terminal, settle, wait_until

LEASE_S = 4.0
HEARTBEAT_S = 0.5
BLOCK_S = 3 * HEARTBEAT_S


def run(r: Run) -> None:
    per_kind = r.size(4, 40)
    store = r.open()
    q = store.queue("chaos", lease_s=LEASE_S)
    kinds = ("sleep", "cpu", "gil")
    ids = [f"starve-{kind}-{k:03d}" for kind in kinds for k in range(per_kind)]
    q.enqueue_many([q.spec(i, {"n": k, "kind": i.split("-")[1], "seconds": BLOCK_S},
                           task="block") for k, i in enumerate(ids)])
    ledger = r.ledger()
    env = {"CHAOS_LEASE_S": str(LEASE_S), "CHAOS_HEARTBEAT_S": str(HEARTBEAT_S)}
    # At most 8 slots a process: dozens of CPU-bound threads in one process starve every
    # thread of the GIL (a convoy), the finishing writes included; such work wants processes.
    slots = min(per_kind * 3 // 2 + 1, 8)
    workers = [r.worker(f"w{k}", concurrency=slots, env=env).start() for k in range(2)]
    # A sweeper of our own, as often as we like: it would reclaim any lapsed lease.
    stop = threading.Event()
    reclaimed = [0, 0]

    def sweep() -> None:
        while not stop.wait(0.2):
            failed, returned = q.reclaim_expired()
            reclaimed[0] += failed
            reclaimed[1] += returned

    sweeper = threading.Thread(target=sweep, daemon=True)
    sweeper.start()
    finished = wait_until(all_terminal(q, ids), r.size(120, 600), 0.2)
    stop.set()
    sweeper.join()
    for w in workers:
        w.stop()
    r.check("all jobs finished in time", finished, str(q.counts()))
    jobs = settle(r, q, ids, ledger, reruns_allowed=False)
    redelivered = [i for i in ids for e in q.journal(i)
                   if e.event in ("reclaimed", "heartbeat_lost") or e.reason == "redelivered"]
    r.check("0 reclaims by our sweeper", reclaimed == [0, 0], str(reclaimed))
    r.check("0 redeliveries / lost heartbeats in the journal", not redelivered,
            str(redelivered[:5]))
    r.check("every job took one attempt", all(jobs[i].attempts == 1 for i in ids),
            str(sorted({jobs[i].attempts for i in ids})))
