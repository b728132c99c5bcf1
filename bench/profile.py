"""Where leaseq spends its time per job: timings without a profiler, then cProfile.

    python -m bench.profile [--store URL ...] [--n 5000] [--top 20]

1. Plain timings on the ``Queue`` API (no profiler overhead): µs per job of ``enqueue``,
   ``enqueue_many``, ``claim`` (batch of ``--batch``) and ``complete``.
2. cProfile of the same enqueue loop, and of a burst drain by leaseq's real ``Worker`` run in
   this process with every thread profiled (the worker runs handlers and finishes in threads).
   Functions are listed by own time, as µs per job.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import threading
import time
from collections.abc import Callable, Iterator

import leaseq
from bench.targets import DEFAULT_POSTGRES_URL, fresh, postgres_reachable
from bench.tasks import QUEUE, TASK


def timings(url: str, n: int, batch: int) -> dict[str, float]:
    """µs per job of each Queue call, measured with perf_counter only."""
    out: dict[str, float] = {}
    with fresh(url, "prof") as target, leaseq.connect(target.url) as store:
        q = store.queue(QUEUE)
        started = time.perf_counter()
        for i in range(n):
            q.enqueue(f"j{i}", {"i": i}, task=TASK)
        out["enqueue (one per call)"] = _us(started, n)
        started = time.perf_counter()
        for first in range(n, 2 * n, 1000):
            q.enqueue_many([q.spec(f"j{i}", {"i": i}, task=TASK)
                            for i in range(first, min(first + 1000, 2 * n))])
        out["enqueue_many (1000 per call)"] = _us(started, n)
        claim_s = complete_s = 0.0
        done = 0
        while done < 2 * n:
            t0 = time.perf_counter()
            jobs = q.claim("prof:1:worker", batch)
            t1 = time.perf_counter()
            for job in jobs:
                q.complete(job)
            complete_s += time.perf_counter() - t1
            claim_s += t1 - t0
            done += len(jobs)
            if not jobs:
                break
        out[f"claim (batch of {batch}), per job"] = claim_s / done * 1e6
        out["complete, per job"] = complete_s / done * 1e6
        store.drop()
    return out


def _us(started: float, n: int) -> float:
    return (time.perf_counter() - started) / n * 1e6


@contextlib.contextmanager
def profile_all_threads() -> Iterator[list[cProfile.Profile]]:
    """cProfile the calling thread and every thread started inside the block."""
    profiles = [cProfile.Profile()]
    original = threading.Thread.run

    def run(self: threading.Thread) -> None:
        profile = cProfile.Profile()
        profiles.append(profile)
        profile.enable()
        try:
            original(self)
        finally:
            profile.disable()

    threading.Thread.run = run  # type: ignore[method-assign]
    profiles[0].enable()
    try:
        yield profiles
    finally:
        profiles[0].disable()
        threading.Thread.run = original  # type: ignore[method-assign]


def profiled_enqueue(url: str, n: int) -> pstats.Stats:
    with fresh(url, "prof") as target, leaseq.connect(target.url) as store:
        q = store.queue(QUEUE)
        with profile_all_threads() as profiles:
            for i in range(n):
                q.enqueue(f"j{i}", {"i": i}, task=TASK)
        store.drop()
    return _merge(profiles)


def profiled_claim_complete(url: str, n: int, batch: int) -> pstats.Stats:
    """Single-threaded claim + complete loop on the Queue API: the store's cost per job
    without the worker's threads (whose GIL waits cProfile would charge to random frames)."""
    with fresh(url, "prof") as target, leaseq.connect(target.url) as store:
        q = store.queue(QUEUE)
        for first in range(0, n, 1000):
            q.enqueue_many([q.spec(f"j{i}", {"i": i}, task=TASK)
                            for i in range(first, min(first + 1000, n))])
        with profile_all_threads() as profiles:
            while jobs := q.claim("prof:1:worker", batch):
                for job in jobs:
                    q.complete(job)
        store.drop()
    return _merge(profiles)


def profiled_drain(url: str, n: int, concurrency: int) -> tuple[pstats.Stats, float]:
    """A burst drain of ``n`` jobs by the real worker, in this process. Returns the wall
    time per job without the profiler too (one unprofiled drain first)."""
    from bench.tasks import app
    from leaseq.worker import Worker, WorkerConfig

    def drain(profiled: bool) -> tuple[list[cProfile.Profile], float]:
        with fresh(url, "prof") as target, leaseq.connect(target.url) as store:
            q = store.queue(QUEUE)
            for first in range(0, n, 1000):
                q.enqueue_many([q.spec(f"j{i}", {"i": i}, task=TASK)
                                for i in range(first, min(first + 1000, n))])
            app.use_store(store)
            worker = Worker(app, WorkerConfig(concurrency=concurrency, burst=True))
            started = time.perf_counter()
            if profiled:
                with profile_all_threads() as profiles:
                    worker.run()
            else:
                profiles = []
                worker.run()
            per_job = _us(started, n)
            assert q.counts().get("done") == n, q.counts()
            store.drop()
        return profiles, per_job

    _, plain = drain(False)
    profiles, _ = drain(True)
    return _merge(profiles), plain


def _merge(profiles: list[cProfile.Profile]) -> pstats.Stats:
    stats = pstats.Stats(profiles[0])
    for profile in profiles[1:]:
        with contextlib.suppress(TypeError):  # a thread that never ran has no stats
            stats.add(profile)
    return stats


def top(stats: pstats.Stats, n_jobs: int, count: int, key: str = "tottime") -> str:
    """The ``count`` costliest functions as µs per job (own time and cumulative)."""
    rows = []
    for (file, line, name), (_cc, calls, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append((tt if key == "tottime" else ct, tt, ct, calls, _where(file, line, name)))
    rows.sort(reverse=True)
    total = sum(r[1] for r in rows)
    lines = [f"  {'own µs/job':>10} {'cum µs/job':>10} {'calls/job':>9}  function",
             f"  {total / n_jobs * 1e6:10.1f} {'':>10} {'':>9}  (all profiled own time)"]
    for _, tt, ct, calls, where in rows[:count]:
        lines.append(f"  {tt / n_jobs * 1e6:10.1f} {ct / n_jobs * 1e6:10.1f} "
                     f"{calls / n_jobs:9.2f}  {where}")
    return "\n".join(lines)


def _where(file: str, line: int, name: str) -> str:
    if file == "~":
        return name
    short = file.split("site-packages/")[-1].split("/src/")[-1]
    return f"{short}:{line}({name})"


def report(url: str, n: int, batch: int, count: int, say: Callable[[str], None]) -> None:
    say(f"\n=== {url.split('?')[0]}: {n} jobs ===")
    for name, us in timings(url, n, batch).items():
        say(f"  {us:8.1f} µs/job  {name}")
    say("\n-- cProfile: enqueue one at a time, by own time --")
    say(top(profiled_enqueue(url, n), n, count))
    say(f"\n-- cProfile: claim (batch {batch}) + complete each, one thread, by own time --")
    say(top(profiled_claim_complete(url, n, batch), n, count))
    stats, plain = profiled_drain(url, n, batch)
    say(f"\n-- cProfile: worker drain (concurrency {batch}); unprofiled {plain:.1f} µs/job --")
    say(top(stats, n, count))
    say("\n-- same drain, by cumulative time --")
    say(top(stats, n, count, key="cumtime"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile")
    p.add_argument("--store", action="append", metavar="URL")
    p.add_argument("--n", type=int, default=5000)
    p.add_argument("--batch", type=int, default=16, help="claim batch / worker concurrency")
    p.add_argument("--top", type=int, default=20)
    args = p.parse_args(argv)
    stores = args.store or ["sqlite://", *([DEFAULT_POSTGRES_URL]
                                           if postgres_reachable(DEFAULT_POSTGRES_URL) is None
                                           else [])]
    for url in stores:
        report(url, args.n, args.batch, args.top, lambda s: print(s, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
