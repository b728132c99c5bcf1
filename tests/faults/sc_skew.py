"""Scenario 4, clock skew: two worker processes whose clocks read +1 h and −1 h → 0 spurious
reclaims, because leases are measured on the database clock.

On PostgreSQL the skew is libfaketime (``LD_PRELOAD``: the C library's clock itself) when it is
installed, else an injected Python clock (``time.time``, ``datetime.now``). On SQLite it is
always the injected Python clock: SQLite's clock *is* the host's C clock, shared by every
process on the one host that can open the file, so faking it would skew the database clock
itself, not a worker's."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time

from leaseq.testing.chaos import Run, all_terminal, settle, wait_until

SKEW_S = 3600.0
#: Beats every lease / 3 = 1 s; the lease clock (1 s margin) runs out 2 s after the last beat
#: confirmed: a busy machine's stalled heartbeat thread has a second to spare.
LEASE_S = 3.0
WORK_S = 2.25  # two heartbeats, most of a lease


def libfaketime() -> str | None:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
                   + glob.glob("/usr/lib/faketime/libfaketime.so.1")
                   + glob.glob("/usr/local/lib/faketime/libfaketime.so.1"))
    return found[0] if found else None


def faketime_env(offset_s: float) -> dict[str, str] | None:
    """libfaketime's environment, if it is installed and Python can sleep under it (0.9.10
    breaks ``time.sleep``: ``clock_nanosleep`` with an absolute deadline fails with EINVAL)."""
    lib = libfaketime()
    if lib is None:
        return None
    env = {"LD_PRELOAD": lib, "FAKETIME": f"{offset_s:+.0f}", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    probe = [sys.executable, "-c", "import threading, time; time.sleep(0.01); "
             "threading.Event().wait(0.01)"]
    try:
        ok = subprocess.run(probe, env={**os.environ, **env}, capture_output=True,
                            timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        ok = False
    return env if ok else None


def skew_env(r: Run, offset_s: float) -> tuple[dict[str, str], str]:
    env = faketime_env(offset_s) if r.store_kind == "postgres" else None
    if env:
        return env, "libfaketime"
    return {"CHAOS_CLOCK_SKEW_S": str(offset_s)}, "python clock"


def run(r: Run) -> None:
    n = r.size(24, 300)
    store = r.open()
    q = store.queue("chaos", lease_s=LEASE_S)
    ids = [f"skew-{i:04d}" for i in range(n)]
    q.enqueue_many([q.spec(i, {"n": k, "sleep_s": WORK_S}, task="clock")
                    for k, i in enumerate(ids)])
    ledger = r.ledger()
    workers = []
    for name, offset in (("ahead", SKEW_S), ("behind", -SKEW_S)):
        env, how = skew_env(r, offset)
        r.log("skew", worker=name, offset_s=offset, how=how)
        workers.append(r.worker(name, concurrency=max(n // 4, 2), env=env).start())
    finished = wait_until(all_terminal(q, ids), r.size(120, 600), 0.2)
    for w in workers:
        w.stop()
    r.check("all jobs finished in time", finished, str(q.counts()))
    jobs = settle(r, q, ids, ledger, reruns_allowed=False)
    seen = [value - time.time() for _, value in ledger.facts("clock")]
    r.check("the workers' clocks really were ±1 h off",
            any(s > SKEW_S - 60 for s in seen) and any(s < -SKEW_S + 60 for s in seen),
            f"offsets seen: {sorted({round(s) for s in seen})}")
    spurious = [i for i in ids for e in q.journal(i)
                if e.event in ("reclaimed", "heartbeat_lost") or e.reason == "redelivered"]
    r.check("0 spurious reclaims (no reclaim, lost beat or re-claim)", not spurious,
            str(spurious[:5]))
    r.check("every job took one attempt", all(jobs[i].attempts == 1 for i in ids),
            str(sorted({jobs[i].attempts for i in ids})))
