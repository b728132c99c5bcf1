"""Runs the plan: every scenario a system supports, on every store, ``plan.repeats`` times."""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rich.console import Console

from bench import scenarios as sc
from bench.adapters import system_class
from bench.stats import Summary
from bench.targets import kind_of

#: Scenarios per system; the raw-SQL ceiling has no handlers, so no latency or memory figures.
FULL_SET = ("enqueue", "bulk", "drain", "latency", "rss", "backlog")
#: leaseq's drains of jobs that carry limits (issue 17), each compared with the plain drain
#: of the same run (the machine's load changes between runs, not within one).
LIMITED_DRAINS = {"drain-priorities": ("priorities", "with priorities (10 levels)"),
                  "drain-keys": ("keys", "with 10 keys, key_limit 4")}
SCENARIOS = {
    "leaseq": (*FULL_SET, *LIMITED_DRAINS),
    "raw-sql": ("enqueue", "bulk", "drain"),
    "pgqueuer": ("enqueue", "bulk", "drain", "latency"),
    "procrastinate": ("enqueue", "bulk", "drain", "latency"),
    "huey": ("enqueue", "drain", "latency"),  # no bulk enqueue API
}


@dataclass
class Run:
    plan: sc.Plan
    results: list[sc.Result] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)


def run_all(plan: sc.Plan, stores: Sequence[str], systems: Sequence[str],
            console: Console, leaseq_worker: str = "auto",
            only_scenarios: Sequence[str] | None = None) -> Run:
    run = Run(plan)
    for url in stores:
        kind = kind_of(url)
        for name in systems:
            cls = system_class(name)
            if kind not in cls.kinds:
                continue
            factory = (functools.partial(cls, worker=leaseq_worker) if name == "leaseq"
                       else cls)
            for scenario in SCENARIOS[name]:
                if only_scenarios and scenario not in only_scenarios:
                    continue
                _run_scenario(run, console, name, kind, url, scenario, factory)
    return run


def _run_scenario(run: Run, console: Console, name: str, kind: str, url: str, scenario: str,
                  factory: sc.Factory) -> None:
    plan = run.plan
    if scenario == "backlog" and not plan.backlog:
        return
    console.log(f"[bold]{name}[/] on {kind}: {scenario}")
    add = functools.partial(_add, run, name, kind)
    try:
        if scenario == "enqueue":
            add("enqueue, one at a time", "jobs/s",
                _repeat(plan, lambda: sc.enqueue_each_once(factory, url, plan)))
        elif scenario == "bulk":
            add(f"enqueue_many ({sc.BULK_BATCH}/call)", "jobs/s",
                _repeat(plan, lambda: sc.enqueue_bulk_once(factory, url, plan)))
        elif scenario == "drain":
            for procs in plan.processes:
                drains = [sc.drain_once(factory, url, plan, procs) for _ in range(plan.repeats)]
                add(f"drain {plan.drain_n:,}, {procs} process{'es' if procs > 1 else ''}",
                    "jobs/s", [d.rate for d in drains],
                    {"wall_rate_jobs_s": [d.wall_rate for d in drains],
                     "concurrency": plan.concurrency})
        elif scenario in LIMITED_DRAINS:
            _limited_drain(run, add, url, scenario, factory)
        elif scenario == "latency":
            runs = [sc.latency_once(factory, url, plan) for _ in range(plan.repeats)]
            extra = {"jobs": plan.latency_jobs, "gap_s": plan.latency_gap_s,
                     "p50_from_enqueue_call_ms": [r[2] for r in runs]}
            add("pickup latency p50", "ms", [r[0] for r in runs], extra, higher=False)
            add("pickup latency p95", "ms", [r[1] for r in runs], extra, higher=False)
        elif scenario == "rss":
            repeats = 1 if plan.rss_n <= 10_000 and plan.repeats > 1 else plan.repeats
            runs = [sc.rss_once(factory, url, plan) for _ in range(repeats)]
            extra = {"jobs": plan.rss_n}
            add(f"worker RSS at 5% of {plan.rss_n:,}", "MiB", [r[0] for r in runs], extra,
                higher=False)
            add(f"worker RSS at end of {plan.rss_n:,}", "MiB", [r[1] for r in runs], extra,
                higher=False)
        elif scenario == "backlog":
            for size in plan.backlog:
                add(f"drain {plan.backlog_window:,} of a {size:,} backlog", "jobs/s",
                    sc.backlog_runs(factory, url, plan, size), {"backlog": size})
    except Exception as exc:  # one broken adapter must not lose the other figures
        console.log(f"[red]{name} on {kind}: {scenario} failed: {exc}")
        run.errors.append({"system": name, "store": kind, "scenario": scenario,
                           "error": f"{type(exc).__name__}: {exc}"[-2000:],
                           "traceback": traceback.format_exc()[-4000:]})


def _limited_drain(run: Run, add: Callable[..., None], url: str, scenario: str,
                   factory: sc.Factory) -> None:
    """The drain with one process, its jobs carrying priorities or keys; the JSON's extra
    has its median as a fraction of the plain drain's in this run (issue 17: ≥ 0.8)."""
    plan = run.plan
    variant, label = LIMITED_DRAINS[scenario]
    limited = functools.partial(factory, variant=variant)
    rates = [sc.drain_once(limited, url, plan, 1).rate for _ in range(plan.repeats)]
    name = f"drain {plan.drain_n:,} {label}, 1 process"
    plain = [r for r in run.results if r.system == "leaseq" and r.store == kind_of(url)
             and r.scenario == f"drain {plan.drain_n:,}, 1 process"]
    extra: dict[str, object] = {"concurrency": plan.concurrency}
    if plain:
        extra["vs_plain_drain"] = Summary.of(rates).median / plain[0].summary.median
    add(name, "jobs/s", rates, extra)


def _repeat(plan: sc.Plan, once: Callable[[], float]) -> list[float]:
    return [once() for _ in range(plan.repeats)]


def _add(run: Run, name: str, kind: str, scenario: str, unit: str, values: list[float],
         extra: dict[str, object] | None = None, higher: bool = True) -> None:
    run.results.append(sc.Result(name, kind, scenario, unit, Summary.of(values), extra or {},
                                 higher))
