"""Scenario 6, poison: 1 % of jobs always raise, 0.5 % call ``os._exit`` → each is quarantined
after exactly ``max_attempts`` attempts with the right failure kind (exhausted / expired); no
healthy job is quarantined. Killed workers are restarted, as an orchestrator would."""

from __future__ import annotations

import time

from leaseq.testing.chaos import Run, all_terminal, settle

POISON_ATTEMPTS = 3
PROCESSES = 3


def run(r: Run) -> None:
    n = r.size(300, 4000)
    raising = set(r.rng.sample(range(n), max(n // 100, 2)))
    exiting = set(r.rng.sample(sorted(set(range(n)) - raising), max(n // 200, 2)))
    store = r.open()
    q = store.queue("chaos")
    ids = [f"poison-{i:05d}" for i in range(n)]
    specs = []
    for k, job_id in enumerate(ids):
        task = "poison_raise" if k in raising else "poison_exit" if k in exiting else "sturdy"
        payload = {"n": k} if task != "sturdy" else {"n": k, "sleep_s": 0.01}
        attempts = POISON_ATTEMPTS if task != "sturdy" else 20
        specs.append(q.spec(job_id, payload, task=task, max_attempts=attempts))
    q.enqueue_many(specs)
    ledger = r.ledger()
    workers = [r.worker(f"w{k}", concurrency=4).start() for k in range(PROCESSES)]
    done = all_terminal(q, ids)
    deadline = time.monotonic() + r.size(120, 900)
    restarts = 0
    crashed: set[str] = set()
    while not done() and time.monotonic() < deadline:
        time.sleep(0.2)
        for w in workers:
            if not w.alive():
                restarts += 1
                crashed.add(str(w.pid))
                w.start()
    for w in workers:
        w.stop()
    r.log("poison_over", restarts=restarts)
    jobs = settle(r, q, ids, ledger, reruns_allowed=True,
                  effect_expected=lambda j: j.task == "sturdy")
    wrong = []
    for k, job_id in enumerate(ids):
        job = jobs[job_id]
        # The attempt each claim spent: a prefetched job given back before it started (free)
        # is claimed again at the same attempt, so claims may outnumber attempts.
        attempts_spent = max(
            (e.attempt or 0 for e in q.journal(job_id) if e.event == "claimed"), default=0)
        want = ("failed", "exhausted" if k in raising else "expired") if k in raising | exiting \
            else ("done", None)
        if k in raising and job.failure == "expired" and _pid(job.worker_id) in crashed:
            want = ("failed", "expired")  # its last attempt died with a neighbour's os._exit
            r.log("collateral", job_id=job_id, worker=job.worker_id)
        spent = want[0] != "failed" or attempts_spent == job.max_attempts
        if (job.status, job.failure) != want or not spent:
            wrong.append((job_id, job.task, job.status, job.failure, attempts_spent))
    r.check("each poison job quarantined after exactly max_attempts attempts, right kind; "
            "no healthy job quarantined", not wrong, str(wrong[:5]))
    r.check("crashed workers were restarted", restarts >= len(exiting), f"{restarts} restarts")


def _pid(worker_id: str | None) -> str:
    """``hostname:pid:uuid8`` → pid."""
    parts = (worker_id or "").split(":")
    return parts[-2] if len(parts) >= 3 else ""
