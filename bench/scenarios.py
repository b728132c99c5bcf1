"""The scenarios of issue 8. Each ``*_once`` function measures one run on one fresh database
and returns numbers; ``run`` repeats it and summarises.

Clocks: throughput uses ``time.perf_counter`` in this process. Pickup latency compares the
worker's ``time.time()`` at handler start with this process's ``time.time()`` when its enqueue
returned (the job committed): two processes, one host clock.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bench.stats import Summary, percentile
from bench.systems import System, WorkerSpec, read_stamps, read_starts, rss_bytes, running
from bench.targets import fresh

BULK_BATCH = 1000  # jobs per enqueue_many call: a typical producer batch


@dataclass(frozen=True)
class Plan:
    """Sizes of one benchmark run. Defaults are the issue's; ``quick`` and ``full`` adjust."""

    single_n: int = 10_000
    bulk_n: int = 10_000
    drain_n: int = 10_000
    processes: tuple[int, ...] = (1, 2)
    latency_jobs: int = 200
    latency_gap_s: float = 0.020
    rss_n: int = 50_000
    backlog: tuple[int, ...] = ()  # e.g. (10_000, 1_000_000) with --full
    backlog_window: int = 10_000  # jobs drained per measurement at each backlog size
    repeats: int = 3
    concurrency: int | None = None  # None: leaseq's worker at its default, the others at 16
    timeout_s: float = 600.0  # one drain may not take longer than this

    @classmethod
    def quick(cls) -> Plan:
        return cls(single_n=2_000, bulk_n=10_000, drain_n=5_000, rss_n=10_000)

    @classmethod
    def full(cls) -> Plan:
        return cls(rss_n=200_000, backlog=(10_000, 1_000_000))

    @classmethod
    def tiny(cls) -> Plan:
        """For the smoke test: seconds, not minutes."""
        return cls(single_n=50, bulk_n=200, drain_n=200, processes=(1,), latency_jobs=5,
                   latency_gap_s=0.01, rss_n=200, repeats=1, concurrency=4, timeout_s=60)


@dataclass
class Result:
    """One scenario of one system on one store, over its repeats."""

    system: str
    store: str
    scenario: str
    unit: str
    summary: Summary
    extra: dict[str, object] = field(default_factory=dict)
    higher_is_better: bool = True

    def to_dict(self) -> dict[str, object]:
        return {"system": self.system, "store": self.store, "scenario": self.scenario,
                "unit": self.unit, "higher_is_better": self.higher_is_better,
                **self.summary.to_dict(), "extra": self.extra}


Factory = Callable[..., System]  # (Target) -> System


@contextlib.contextmanager
def opened(factory: Factory, base_url: str, label: str) -> Iterator[System]:
    with fresh(base_url, label) as target, factory(target) as system:
        yield system


# --- enqueue ----------------------------------------------------------------------------------


#: Single enqueues made before the timed ones, untimed (see ``enqueue_each_once``).
WARM_UP_EACH = 10


def enqueue_each_once(factory: Factory, base_url: str, plan: Plan) -> float:
    """Jobs/s of ``plan.single_n`` single enqueues, after ``WARM_UP_EACH`` untimed ones: the
    first calls of a fresh client open connections and prepare statements, which a producer
    pays once per process, not per job (ids after the timed ones')."""
    with opened(factory, base_url, "enq1") as system:
        system.enqueue_each(plan.single_n, WARM_UP_EACH)
        started = time.perf_counter()
        system.enqueue_each(0, plan.single_n)
        return plan.single_n / (time.perf_counter() - started)


def enqueue_bulk_once(factory: Factory, base_url: str, plan: Plan) -> float:
    """Jobs/s of ``plan.bulk_n`` jobs in batches of ``BULK_BATCH``, after one untimed batch
    (as in ``enqueue_each_once``: 10 batches are timed, and a first call's set-up weighed
    up to a quarter of one run)."""
    with opened(factory, base_url, "bulk") as system:
        system.enqueue_bulk(plan.bulk_n, BULK_BATCH, BULK_BATCH)
        started = time.perf_counter()
        system.enqueue_bulk(0, plan.bulk_n, BULK_BATCH)
        return plan.bulk_n / (time.perf_counter() - started)


# --- drain ------------------------------------------------------------------------------------


@dataclass
class Drain:
    rate: float  # jobs/s from the first finished job to the last (start-up excluded)
    wall_rate: float  # jobs/s from spawning the workers (start-up included)
    rss_samples: list[tuple[int, int]] = field(default_factory=list)  # (done, bytes)


def drain(system: System, goal: int, processes: int, plan: Plan, sample_rss: bool = False,
          stop_early: bool = False, stamped: bool = False) -> Drain:
    """Start workers and wait until the store counts ``goal`` more finished jobs.

    ``stop_early``: the queue holds more than ``goal`` (backlog scenario); stop the workers
    once the goal is reached instead of waiting for them to empty it. ``stamped`` (one
    process): the rate comes from the handlers' own start times (kept in memory, written at
    exit), and the worker marks when it has started ``goal`` jobs, so nothing counts the
    table meanwhile: a count of a 1,000,000-job table takes long enough that a fast drain of
    ``goal`` jobs fits between two polls, and on SQLite the counting reader slows the writer.
    """
    if stamped and processes != 1:
        raise ValueError("a stamped drain runs one worker process")
    with tempfile.TemporaryDirectory(prefix="leaseq-bench-stamps-") as folder:
        prefix = os.path.join(folder, "stamps") if stamped else None
        result = _drain(system, goal, processes, plan, sample_rss, stop_early, prefix)
        if prefix is None:
            return result
        starts = read_stamps(prefix)
    if len(starts) < goal:
        raise RuntimeError(f"{system.name}: {len(starts)} of {goal} handler starts recorded")
    result.rate = (goal - 1) / max(starts[goal - 1] - starts[0], 1e-9)
    return result


def _drain(system: System, goal: int, processes: int, plan: Plan, sample_rss: bool,
           stop_early: bool, stamps_prefix: str | None) -> Drain:
    base = 0 if stamps_prefix else system.done_count()
    spec = WorkerSpec(plan.concurrency, burst=True, stamps_prefix=stamps_prefix,
                      stamps_goal=goal)
    samples: list[tuple[int, int]] = []
    spawned = time.perf_counter()
    with running(system, spec, processes) as workers:
        first: tuple[float, int] | None = None
        interval = 0.02
        while True:
            exited = workers.all_exited()  # before the count, so that the count is final
            polled = time.perf_counter()
            if stamps_prefix:
                done = goal if os.path.exists(f"{stamps_prefix}.reached") else 0
            else:
                done = system.done_count() - base
            now = time.perf_counter()
            # A count over a large table is not free; poll less often rather than steal
            # the CPU the workers need.
            interval = max(0.02, 4 * (now - polled))
            if first is None and done > 0:
                first = (polled, done)
            if sample_rss and done > 0:
                samples.append((done, sum(rss_bytes(pid) for pid in workers.pids)))
            if done >= goal:
                break
            workers.check()
            if exited:
                raise RuntimeError(f"{system.name}: every worker exited with {done} of {goal} "
                                   f"jobs done\n{workers.output()}")
            if now - spawned > plan.timeout_s:
                raise TimeoutError(f"{system.name}: {done} of {goal} jobs done after "
                                   f"{plan.timeout_s:.0f} s\n{workers.output()}")
            time.sleep(interval)
        workers.stop(now=stop_early)
    wall = goal / (now - spawned)
    t0, d0 = first or (spawned, 0)
    # Counts are as of each poll's start (the count's snapshot), and the jobs counted are all
    # that were done then: in a backlog the workers go on past the goal, and a count of a large
    # table is coarse, so `done` may be well past `goal` by the last poll. When the first poll
    # already saw most of the work done, the window is too short to mean anything: fall back
    # to the rate with start-up included.
    rate = ((done - d0) / (polled - t0) if polled - t0 > 0.05 and d0 < goal / 2 else wall)
    return Drain(rate, wall, samples)


def drain_once(factory: Factory, base_url: str, plan: Plan, processes: int,
               stamped: bool = False) -> Drain:
    with opened(factory, base_url, f"drain{processes}") as system:
        system.enqueue_bulk(0, plan.drain_n, BULK_BATCH)
        return drain(system, plan.drain_n, processes, plan, stamped=stamped)


def rss_once(factory: Factory, base_url: str, plan: Plan) -> tuple[float, float]:
    """Worker RSS (MiB) early in a long drain (at 5 % done) and at its end."""
    with opened(factory, base_url, "rss") as system:
        system.enqueue_bulk(0, plan.rss_n, BULK_BATCH)
        samples = drain(system, plan.rss_n, 1, plan, sample_rss=True).rss_samples
    alive = [(done, rss) for done, rss in samples if rss > 0]
    if not alive:
        raise RuntimeError("the worker exited before its memory could be sampled")
    early = next((rss for done, rss in alive if done >= plan.rss_n * 0.05), alive[0][1])
    return early / 2**20, alive[-1][1] / 2**20


def backlog_runs(factory: Factory, base_url: str, plan: Plan, size: int) -> list[float]:
    """Drain rate of ``plan.backlog_window`` jobs with ``size`` jobs queued, from the
    handlers' start times (both sizes alike: see ``drain``'s ``stamped``).

    A backlog the size of the window is built fresh per repeat; a larger one is built once
    and every repeat drains its next window (it stays within a few % of ``size``).
    """
    if size <= plan.backlog_window:
        return [drain_once(factory, base_url, plan.__class__(**{
            **plan.__dict__, "drain_n": size}), 1, stamped=True).rate
            for _ in range(plan.repeats)]
    with opened(factory, base_url, "backlog") as system:
        system.enqueue_bulk(0, size, 10_000)
        return [drain(system, plan.backlog_window, 1, plan, stop_early=True, stamped=True).rate
                for _ in range(plan.repeats)]


# --- pickup latency ---------------------------------------------------------------------------


def latency_once(factory: Factory, base_url: str, plan: Plan) -> tuple[float, float, float]:
    """p50, p95 (ms) of handler start − enqueue returned, and p50 from before enqueue."""
    fd, starts_path = tempfile.mkstemp(prefix="leaseq-bench-starts-")
    os.close(fd)
    try:
        with opened(factory, base_url, "latency") as system:
            spec = WorkerSpec(plan.concurrency, burst=False, starts_path=starts_path)
            with running(system, spec, 1) as workers:
                warm = plan.latency_jobs  # one warm-up job, index past the measured ones
                system.enqueue_each(warm, 1)
                _wait_done(system, workers, 1, plan)
                time.sleep(0.25)  # let the worker go idle
                before, after = _enqueue_paced(system, plan)
                _wait_done(system, workers, plan.latency_jobs + 1, plan)
        starts = read_starts(starts_path)
    finally:
        os.remove(starts_path)
    missing = [i for i in range(plan.latency_jobs) if i not in starts]
    if missing:
        raise RuntimeError(f"{len(missing)} jobs recorded no start time")
    waits = [(starts[i] - after[i]) * 1000 for i in range(plan.latency_jobs)]
    e2e = [(starts[i] - before[i]) * 1000 for i in range(plan.latency_jobs)]
    return percentile(waits, 50), percentile(waits, 95), percentile(e2e, 50)


def _enqueue_paced(system: System, plan: Plan) -> tuple[list[float], list[float]]:
    before: list[float] = []
    after: list[float] = []
    origin = time.perf_counter()
    for i in range(plan.latency_jobs):
        pause = origin + i * plan.latency_gap_s - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        before.append(time.time())
        system.enqueue_each(i, 1)
        after.append(time.time())
    return before, after


def _wait_done(system: System, workers: object, goal: int, plan: Plan) -> None:
    deadline = time.monotonic() + min(plan.timeout_s, 120)
    while system.done_count() < goal:
        workers.check()  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{system.name}: {goal} jobs not done in time\n"
                               f"{workers.output()}")  # type: ignore[attr-defined]
        time.sleep(0.01)
