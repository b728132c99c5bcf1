"""Scenario 1, SIGKILL storm: worker processes killed every 1–2 s and restarted, lease 2 s →
every job terminal exactly once, none lost, effects unique except fenced re-runs after a kill,
attempts ≤ max."""

from __future__ import annotations

import time

from leaseq.testing.chaos import Run, all_terminal, settle

PROCESSES = 4


def run(r: Run) -> None:
    n = r.size(300, 5000)
    store = r.open()
    q = store.queue("chaos", max_attempts=5)
    ids = [f"storm-{i:05d}" for i in range(n)]
    # Work per job such that the run lasts long enough for several kills (~6 s quick).
    sleep_s = r.size(0.08, 0.05)
    q.enqueue_many([q.spec(i, {"n": k, "sleep_s": sleep_s}, task="work", max_attempts=5)
                    for k, i in enumerate(ids)])
    ledger = r.ledger()
    workers = [r.worker(f"w{k}", concurrency=4).start() for k in range(PROCESSES)]
    done = all_terminal(q, ids)
    deadline = time.monotonic() + r.size(90, 900)
    kills = 0
    while not done() and time.monotonic() < deadline:
        time.sleep(r.rng.uniform(1.0, 2.0))
        victim = r.rng.choice(workers)
        victim.kill()
        kills += 1
        victim.start()
    for w in workers:
        w.stop()
    r.log("storm_over", kills=kills)
    jobs = settle(r, q, ids, ledger, reruns_allowed=True)
    r.check("at least 2 kills happened", kills >= 2, f"only {kills}")
    r.check("every job done", all(jobs[i].status == "done" for i in ids if i in jobs),
            str(sorted({jobs[i].status for i in ids if i in jobs})))
