"""The tasks the chaos scenarios' worker processes run: ``leaseq worker chaos_tasks:app``.

Every handler that makes a side effect records it in the run's ledger (``$CHAOS_EFFECTS``)
under its job id and effect name, so a repeat is counted. Policy comes from the environment
the scenario gives the worker (this is a test fixture, built once per worker process):
``CHAOS_LEASE_S`` (2), ``CHAOS_HEARTBEAT_S`` (lease / 4), ``CHAOS_MAX_ATTEMPTS`` (5),
``CHAOS_BACKOFF_S`` (0.05). ``CHAOS_CLOCK_SKEW_S`` shifts this process's Python clock
(``time.time``, ``datetime.now``) when libfaketime is not used.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from leaseq import App, Job, LeaseLost, Permanent, Retry
from leaseq.testing.chaos import Ledger
from leaseq.testing.harness import shifted_clock

_SKEW = float(os.environ.get("CHAOS_CLOCK_SKEW_S", "0") or 0)
_SHIFT = shifted_clock(_SKEW)  # kept referenced: collecting it would undo the shift
if _SKEW:
    _SHIFT.__enter__()  # for the life of this worker process

LEASE_S = float(os.environ.get("CHAOS_LEASE_S", "2"))
HEARTBEAT_S = float(os.environ.get("CHAOS_HEARTBEAT_S", str(LEASE_S / 4)))
MAX_ATTEMPTS = int(os.environ.get("CHAOS_MAX_ATTEMPTS", "5"))
BACKOFF_S = float(os.environ.get("CHAOS_BACKOFF_S", "0.05"))
POLICY: dict[str, Any] = {"lease_s": LEASE_S, "heartbeat_every_s": HEARTBEAT_S,
                          "max_attempts": MAX_ATTEMPTS, "backoff_base_s": BACKOFF_S,
                          "backoff_cap_s": BACKOFF_S * 4}

app = App(queues={"chaos": POLICY})
_ledger: Ledger | None = None
#: Partition scenarios: where this worker reports its longest store call per thread.
PROBE_PATH = os.environ.get("CHAOS_PROBE")


def ledger() -> Ledger:
    global _ledger
    if _ledger is None:
        _ledger = Ledger(os.environ["CHAOS_EFFECTS"])
    return _ledger


def _worker() -> str:
    return f"pid{os.getpid()}"


@app.task(queue="chaos")
def work(n: int, job: Job, sleep_s: float = 0.0) -> dict[str, int]:
    """The healthy job: one effect, then a little work."""
    ledger().record(job, "work", _worker())
    if sleep_s:
        time.sleep(sleep_s)
    return {"n": n}


@app.task(queue="chaos")
def hold(n: int, job: Job, hold_s: float, watch: bool, then: str) -> dict[str, int]:
    """Scenario 2: effect first, then hold the job (SIGSTOP lands here). ``watch`` ends the
    hold as soon as the heartbeat finds the lease lost; ``then`` is ``complete`` or ``fail``."""
    ledger().record(job, "work", _worker())
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline and not (watch and job.lease_lost):
        time.sleep(0.02)
    if then == "fail":
        raise Permanent("the stale worker gives up")
    return {"n": n, "by": "stale"}


@app.task(queue="chaos")
def block(n: int, job: Job, kind: str, seconds: float) -> dict[str, int]:
    """Scenario 3: hold the thread the way real handlers do for ``seconds``."""
    ledger().record(job, "work", _worker())
    deadline = time.monotonic() + seconds
    if kind == "sleep":
        time.sleep(seconds)
    elif kind == "cpu":
        x = 0
        while time.monotonic() < deadline:
            for i in range(10_000):
                x += i * i
    else:  # C calls that hold the GIL briefly each (big-integer arithmetic, ~10 ms)
        # Longer ones across dozens of threads starve every other thread of the GIL, the
        # heartbeat's included: such handlers belong in processes (docs/worker.md).
        while time.monotonic() < deadline:
            pow(3, 300_000)
    return {"n": n}


@app.task(queue="chaos")
def clock(n: int, job: Job, sleep_s: float) -> dict[str, int]:
    """Scenario 4: note this process's idea of the time, then work past a few beats."""
    ledger().fact("clock", job.id, time.time())
    ledger().record(job, "work", _worker())
    time.sleep(sleep_s)
    return {"n": n}


@app.task(queue="chaos", max_attempts=3)
def poison_raise(n: int, job: Job) -> None:
    """Scenario 6: always fails; quarantined as exhausted after max_attempts attempts."""
    ledger().record(job, f"attempt-{job.attempts}", _worker())
    raise RuntimeError(f"poison job {n} fails on every attempt")


@app.task(queue="chaos", max_attempts=3)
def poison_exit(n: int, job: Job) -> None:
    """Scenario 6: kills its worker process; quarantined as expired after max_attempts."""
    ledger().record(job, f"attempt-{job.attempts}", _worker())
    os._exit(3)


@app.task(queue="chaos", max_attempts=20)
def sturdy(n: int, job: Job, sleep_s: float = 0.0) -> dict[str, int]:
    """Scenario 6's healthy job: enough attempts that crashes of its neighbours never spend
    them all, so a healthy job in quarantine would be a real fault."""
    ledger().record(job, "work", _worker())
    if sleep_s:
        time.sleep(sleep_s)
    return {"n": n}


@app.task(queue="chaos")
def drain(n: int, job: Job, seconds: float) -> dict[str, int]:
    """Scenario 10: cooperative: stops early when the lease is gone (given back at shutdown),
    and makes its effect only when it finished its work. ``CHAOS_DRAIN_FAST``: no dawdling."""
    started = os.environ.get("CHAOS_DRAIN_STARTS")
    if started:  # a file per job whose handler started, for the scenario to wait on
        Path(started, job.id).touch()
    deadline = time.monotonic() + (0.05 if os.environ.get("CHAOS_DRAIN_FAST") else seconds)
    while time.monotonic() < deadline:
        if job.lease_lost:
            raise Retry("given back", delay_s=0)
        time.sleep(0.02)
    ledger().record(job, "work", _worker())
    return {"n": n}


@app.task(queue="chaos")
def echo(job: Job, **fields: Any) -> None:
    """Scenarios 8 and 9: any payload; nothing returned, nothing logged."""
    ledger().record(job, "work", _worker())


@app.task(queue="chaos", max_attempts=2)
def secretive(token: str, job: Job, mode: str = "retry") -> None:
    """Scenario 9: a payload holding a secret; the handler fails without echoing it."""
    ledger().record(job, f"attempt-{job.attempts}", _worker())
    if mode == "retry":
        raise Retry("upstream said 503", delay_s=0)
    if mode == "crash":
        raise ValueError("could not parse the upstream answer")
    raise Permanent("account closed")


#: Scenario 9: where a library's exception message carries a secret, one form per kind the
#: redactor knows.
LEAKS = {
    "url": "could not connect to postgresql://app:{}@db.internal:5432/jobs",
    "token": "GET /v1/items?page=2&token={} answered 401",
    "json": 'upstream answered {{"error": "denied", "api_key": "{}"}}',
    "bearer": "sent Bearer {} and the server said 401",
    "hex": "signature {} does not match",
}


@app.task(queue="chaos", max_attempts=2)
def leaky(secret: str, form: str, how: str, job: Job) -> None:
    """Scenario 9: fails with ``secret`` in its exception's message (``LEAKS[form]``), as a
    library does: ``how`` is ``raise`` (an unexpected error: retried, then exhausted),
    ``retry`` (``Retry``) or ``permanent``."""
    ledger().record(job, f"attempt-{job.attempts}", _worker())
    message = LEAKS[form].format(secret)
    if how == "retry":
        raise Retry(message, delay_s=0)
    if how == "permanent":
        raise Permanent(message)
    raise ConnectionError(message)


@app.task(queue="chaos", max_attempts=20)
def steady(n: int, job: Job, work_s: float) -> dict[str, int]:
    """Partition scenarios: a long handler done right. It checks its lease every 20 ms and
    stops when the worker abandons the job; its start and stop are stamped on the host's
    monotonic clock (shared by every network namespace), its effect comes only at the end."""
    start, how = time.monotonic(), "finished"
    try:
        while time.monotonic() < start + work_s:
            job.check()
            time.sleep(0.02)
    except LeaseLost:
        how = "lease_lost"
        raise
    finally:
        stop = time.monotonic()
        ledger().fact("run", job.id, {"epoch": job.lease_epoch, "pid": os.getpid(),
                                      "start": start, "stop": stop, "how": how})
    ledger().record(job, "work", _worker())
    return {"n": n}


def _probe_store_calls(path: str) -> None:
    """Time every PostgreSQL store call by thread (the longest per thread kind), note the
    longest bound a caller's deadline gave one (infinite: a call without a deadline), and
    whether the heartbeat thread lives; written to ``path`` every 0.2 s."""
    from leaseq import deadline
    from leaseq.stores.postgres import session

    longest: dict[str, float] = {}
    bounds: dict[str, float] = {}
    original = session.Session.run

    def timed(self: Any, work: Any, **kwargs: Any) -> Any:
        kind = re.sub(r"_\d+$", "", threading.current_thread().name)
        bound = deadline.remaining_s()
        bounds[kind] = max(bounds.get(kind, 0.0), math.inf if bound is None else bound)
        started = time.monotonic()
        try:
            return original(self, work, **kwargs)
        finally:
            longest[kind] = max(longest.get(kind, 0.0), time.monotonic() - started)

    session.Session.run = timed  # type: ignore[method-assign]

    def report() -> None:
        while True:
            alive = any(t.name == "leaseq-heartbeat" and t.is_alive()
                        for t in threading.enumerate())
            with open(path + ".tmp", "w", encoding="utf-8") as fh:
                json.dump({"longest_s": longest, "bound_s": bounds, "heartbeat_alive": alive}, fh)
            os.replace(path + ".tmp", path)
            time.sleep(0.2)

    threading.Thread(target=report, name="chaos-probe", daemon=True).start()


if PROBE_PATH:
    _probe_store_calls(PROBE_PATH)
