"""Runs the plan: every scenario a system supports, on every store, ``plan.repeats`` times, the
systems taking turns run by run."""

from __future__ import annotations

import functools
import traceback
from collections.abc import Sequence
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
                  "drain-keys": ("keys", "with 10 keys, key_limit 4"),
                  "drain-wide-keys": ("wide-keys", "with 100 keys, key_limit 4")}
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


@dataclass
class Reading:
    """One figure of one run: a row of the table (``label``) and its value; ``per_run``
    extras are kept as a list over the runs, ``fixed`` ones once."""

    label: str
    unit: str
    value: float
    per_run: dict[str, float] = field(default_factory=dict)
    fixed: dict[str, object] = field(default_factory=dict)
    higher: bool = True


@dataclass
class Samples:
    """The readings of one system in one scenario, over its runs, by row."""

    rows: dict[str, list[Reading]] = field(default_factory=dict)

    def add(self, readings: list[Reading]) -> None:
        for reading in readings:
            self.rows.setdefault(reading.label, []).append(reading)


def run_all(plan: sc.Plan, stores: Sequence[str], systems: Sequence[str],
            console: Console, leaseq_worker: str = "auto",
            only_scenarios: Sequence[str] | None = None, leaseq_ids: str = "counter") -> Run:
    """Every scenario on every store, its runs taking turns among the systems (run 1 of each,
    then run 2 of each, the first to go moving on by one each time), so that the machine's
    drift over minutes does not land on one system's runs."""
    run = Run(plan)
    for url in stores:
        kind = kind_of(url)
        factories = {name: (functools.partial(system_class(name), worker=leaseq_worker,
                                              ids=leaseq_ids)
                            if name == "leaseq" else system_class(name))
                     for name in systems if kind in system_class(name).kinds}
        for scenario in SCENARIOS["leaseq"]:
            if only_scenarios and scenario not in only_scenarios:
                continue
            takers = {name: factory for name, factory in factories.items()
                      if scenario in SCENARIOS[name]}
            if takers and not (scenario == "backlog" and not plan.backlog):
                _run_scenario(run, console, kind, url, scenario, takers)
    return run


def _run_scenario(run: Run, console: Console, kind: str, url: str, scenario: str,
                  takers: dict[str, sc.Factory]) -> None:
    samples = {name: Samples() for name in takers}
    runs = _runs(run.plan, scenario)
    for turn in range(runs):
        names = list(takers)
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            if name not in samples:  # failed in an earlier run
                continue
            console.log(f"[bold]{name}[/] on {kind}: {scenario} ({turn + 1}/{runs})")
            try:
                samples[name].add(_once(run, scenario, takers[name], url))
            except Exception as exc:  # one broken adapter must not lose the other figures
                console.log(f"[red]{name} on {kind}: {scenario} failed: {exc}")
                run.errors.append({"system": name, "store": kind, "scenario": scenario,
                                   "error": f"{type(exc).__name__}: {exc}"[-2000:],
                                   "traceback": traceback.format_exc()[-4000:]})
                del samples[name]
    for name, sample in samples.items():
        for readings in sample.rows.values():
            result = _add(run, name, kind, readings)
            if scenario in LIMITED_DRAINS:
                _compare_with_plain_drain(run, result)


def _runs(plan: sc.Plan, scenario: str) -> int:
    if scenario == "rss" and plan.rss_n <= 10_000 and plan.repeats > 1:
        return 1  # a short memory run says little more when repeated
    if scenario == "backlog":
        return 1  # backlog_runs repeats within its one backlog (built once: a million jobs)
    return plan.repeats


def _once(run: Run, scenario: str, factory: sc.Factory, url: str) -> list[Reading]:
    """One run of ``scenario``: its readings."""
    plan = run.plan
    if scenario == "enqueue":
        return [Reading("enqueue, one at a time", "jobs/s",
                        sc.enqueue_each_once(factory, url, plan))]
    if scenario == "bulk":
        return [Reading(f"enqueue_many ({sc.BULK_BATCH}/call)", "jobs/s",
                        sc.enqueue_bulk_once(factory, url, plan))]
    if scenario == "drain":
        readings = []
        for procs in plan.processes:
            drained = sc.drain_once(factory, url, plan, procs)
            readings.append(Reading(
                f"drain {plan.drain_n:,}, {procs} process{'es' if procs > 1 else ''}", "jobs/s",
                drained.rate, {"wall_rate_jobs_s": drained.wall_rate},
                {"concurrency": plan.concurrency}))
        return readings
    if scenario in LIMITED_DRAINS:
        variant, label = LIMITED_DRAINS[scenario]
        limited = functools.partial(factory, variant=variant)
        return [Reading(f"drain {plan.drain_n:,} {label}, 1 process", "jobs/s",
                        sc.drain_once(limited, url, plan, 1).rate, {},
                        {"concurrency": plan.concurrency})]
    if scenario == "latency":
        p50, p95, p50_from_call = sc.latency_once(factory, url, plan)
        per_run = {"p50_from_enqueue_call_ms": p50_from_call}
        fixed: dict[str, object] = {"jobs": plan.latency_jobs, "gap_s": plan.latency_gap_s}
        return [Reading("pickup latency p50", "ms", p50, per_run, fixed, higher=False),
                Reading("pickup latency p95", "ms", p95, per_run, fixed, higher=False)]
    if scenario == "rss":
        early, end = sc.rss_once(factory, url, plan)
        return [Reading(f"worker RSS at 5% of {plan.rss_n:,}", "MiB", early, {},
                        {"jobs": plan.rss_n}, higher=False),
                Reading(f"worker RSS at end of {plan.rss_n:,}", "MiB", end, {},
                        {"jobs": plan.rss_n}, higher=False)]
    if scenario == "backlog":
        return [Reading(f"drain {plan.backlog_window:,} of a {size:,} backlog", "jobs/s", rate,
                        {}, {"backlog": size})
                for size in plan.backlog for rate in sc.backlog_runs(factory, url, plan, size)]
    raise ValueError(f"unknown scenario {scenario!r}")


def _compare_with_plain_drain(run: Run, limited: sc.Result) -> None:
    """A limited drain's JSON extra holds its median as a fraction of the plain drain's in
    this run (issue 17: ≥ 0.8): the machine's load changes between runs, not within one."""
    plain = [r for r in run.results if r.system == "leaseq" and r.store == limited.store
             and r.scenario == f"drain {run.plan.drain_n:,}, 1 process"]
    if plain:
        limited.extra["vs_plain_drain"] = limited.summary.median / plain[0].summary.median


def _add(run: Run, name: str, kind: str, readings: list[Reading]) -> sc.Result:
    """One row of the results from its readings over the runs; returned as added."""
    first = readings[0]
    extra: dict[str, object] = {key: [r.per_run[key] for r in readings] for key in first.per_run}
    extra.update(first.fixed)
    result = sc.Result(name, kind, first.label, first.unit,
                       Summary.of([r.value for r in readings]), extra, first.higher)
    run.results.append(result)
    return result
