"""Scenario 12, periodic jobs under SIGKILL (issue 16).

Three worker processes run an every-second schedule (``catch_up="all"``); every few seconds
one of them is SIGKILLed (often mid-compare-and-set or mid-job) and started again. Every tick
of the window must be one job, none missing, none twice, and every job done. Halfway, all
three are killed at once and stay down for a few ticks: the first one back must catch the gap
up (``catch_up="all"``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from leaseq.ledger import format_tick
from leaseq.testing.chaos import Run, all_terminal, settle, wait_until

QUEUE = "periodic"
NAME = "beat"


def run(r: Run) -> None:
    store = r.open()
    workers = [r.worker(f"w{k}", concurrency=2, app="chaos_periodic:app", log_level="warning")
               for k in range(3)]
    for w in workers:
        w.start()
    registered = wait_until(lambda: store.schedule_state(NAME) is not None, 30, 0.05)
    r.check("the workers registered the schedule", registered)
    if not registered:
        return
    first = store.schedule_state(NAME).cursor  # type: ignore[union-attr]
    kills = _kill_and_restart(r, workers, seconds=r.size(10, 30))
    window_end = store.server_now()
    caught_up = wait_until(lambda: store.schedule_state(NAME).cursor >= window_end, 30)  # type: ignore[union-attr]
    r.check("the schedulers caught up with the window", caught_up)
    ticks = _expected(first, window_end)
    q = store.queue(QUEUE)
    finished = wait_until(all_terminal(q, [_job_id(t) for t in ticks]), 60, 0.2)
    for w in workers:
        w.stop()
    r.check("every tick's job finished", finished, str(q.counts()))
    _check_ticks(r, q, ticks, first, window_end)
    r.log("periodic", ticks=len(ticks), kills=kills)
    settle(r, q, [_job_id(t) for t in ticks], r.ledger(), reruns_allowed=True)


def _kill_and_restart(r: Run, workers: list, seconds: float) -> int:  # type: ignore[type-arg]
    """SIGKILL a random worker every 1.5-3 s for ``seconds`` and start it again at once;
    once, halfway, kill them all and keep them down for 2.5 s."""
    deadline = time.monotonic() + seconds
    blackout_at = time.monotonic() + seconds / 2
    kills = 0
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(r.rng.uniform(1.5, 3.0), left))
        if time.monotonic() >= deadline:
            break
        if blackout_at and time.monotonic() >= blackout_at:
            kills += _blackout(r, workers, down_s=2.5)
            blackout_at = 0.0
            continue
        victim = r.rng.choice(workers)
        victim.kill()
        victim.start()
        kills += 1
    return kills


def _blackout(r: Run, workers: list, down_s: float) -> int:  # type: ignore[type-arg]
    for w in workers:
        w.kill()
    r.log("blackout", seconds=down_s)
    time.sleep(down_s)
    for w in workers:
        w.start()
    return len(workers)


def _expected(first: datetime, end: datetime) -> list[datetime]:
    """Every whole second after the registration's cursor up to the window's end."""
    start = first.replace(microsecond=0) + timedelta(seconds=1)
    count = int((end.replace(microsecond=0) - start).total_seconds()) + 1
    return [start + timedelta(seconds=n) for n in range(max(count, 0))]


def _job_id(tick: datetime) -> str:
    return f"{NAME}@{format_tick(tick)}"


def _check_ticks(r: Run, q, ticks: list[datetime], first: datetime,  # type: ignore[no-untyped-def]
                 end: datetime) -> None:
    wanted = {_job_id(t) for t in ticks}
    made = [j.id for j in q.iter_jobs()]
    in_window = [i for i in made if _tick_of(i) is not None
                 and first < _tick_of(i) <= end]  # type: ignore[operator]
    missing = sorted(wanted - set(made))
    twice = len(in_window) - len(set(in_window))
    strays = sorted(set(in_window) - wanted)
    enqueued = {i: sum(1 for e in q.journal(i) if e.event == "enqueued") for i in wanted}
    written_twice = [i for i, n in enqueued.items() if n > 1]
    r.check(f"every tick of the window is a job ({len(ticks)} ticks)", not missing,
            f"missing {missing[:5]}")
    r.check("no tick twice (one job id, one enqueue each)", not twice and not written_twice
            and not strays, f"twice {twice}, re-enqueued {written_twice[:5]}, {strays[:5]}")


def _tick_of(job_id: str) -> datetime | None:
    name, _, text = job_id.partition("@")
    if name != NAME or text.startswith("manual-"):
        return None
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
