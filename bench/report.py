"""The side-by-side table (rich) and the JSON file of a run, with the machine it ran on."""

from __future__ import annotations

import json
import os
import platform
import sqlite3
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime
from urllib.parse import urlsplit, urlunsplit

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.runner import Run
from bench.scenarios import Result
from bench.targets import describe, kind_of


def machine(stores: Sequence[str]) -> dict[str, object]:
    """What the numbers depend on: cores, CPU, memory, load, Python and database versions."""
    info: dict[str, object] = {
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "loadavg_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
    }
    for url in stores:
        if kind_of(url) == "postgresql":
            info["postgresql"] = _pg_version(url)
    info["packages"] = _versions(["leaseq", "psycopg", "pgqueuer", "procrastinate", "huey",
                                  "asyncpg"])
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except FileNotFoundError:
        pass
    return platform.processor() or "unknown"


def _pg_version(url: str) -> str:
    try:
        import psycopg

        parts = urlsplit(url)
        with psycopg.connect(urlunsplit(("postgresql", parts.netloc, parts.path, "", "")),
                             connect_timeout=3) as conn:
            return str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
    except Exception as exc:
        return f"unknown ({type(exc).__name__})"


def _versions(names: Sequence[str]) -> dict[str, str]:
    from importlib import metadata

    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def git_revision() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def to_json(run: Run, stores: Sequence[str], info: dict[str, object], argv: Sequence[str]
            ) -> dict[str, object]:
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "argv": list(argv),
        "git": git_revision(),
        "machine": info,
        "stores": [describe(u) for u in stores],
        "plan": run.plan.__dict__,
        "results": [r.to_dict() for r in run.results],
        "errors": run.errors,
    }


def write_json(data: dict[str, object], path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2, default=str)
        f.write("\n")


def print_tables(run: Run, console: Console, info: dict[str, object]) -> None:
    console.print(f"[bold]machine[/]: {info['nproc']} cores, {info['cpu']}, "
                  f"{info['ram_gib']} GiB RAM, load {_load(info)}; Python {info['python']}, "
                  f"SQLite {info['sqlite']}"
                  + (f", PostgreSQL {info['postgresql']}" if "postgresql" in info else ""))
    for store in dict.fromkeys(r.store for r in run.results):
        console.print(table(run.results, store))
    for error in run.errors:
        console.print(f"[red]{error['system']} on {error['store']} ({error['scenario']}): "
                      f"{error['error'].splitlines()[0]}")


def _load(info: dict[str, object]) -> str:
    load = info.get("loadavg_at_start") or ()
    return "/".join(f"{x:.1f}" for x in load)  # type: ignore[union-attr]


def table(results: Sequence[Result], store: str) -> Table:
    """Rows: scenarios. Columns: systems, median [min–max]; others also as leaseq's ratio."""
    mine = [r for r in results if r.store == store]
    systems = list(dict.fromkeys(r.system for r in mine))
    grid = Table(title=escape(f"{store} — median [min–max] of {_repeats(mine)} runs"),
                 title_justify="left")
    grid.add_column("scenario")
    grid.add_column("unit")
    for name in systems:
        grid.add_column(name, justify="right")
    by = {(r.scenario, r.system): r for r in mine}
    for scenario in dict.fromkeys(r.scenario for r in mine):
        ours = by.get((scenario, "leaseq"))
        cells = []
        for name in systems:
            result = by.get((scenario, name))
            cells.append("" if result is None else escape(cell(result, ours)))
        unit = next(r.unit for r in mine if r.scenario == scenario)
        grid.add_row(scenario, unit, *cells)
    return grid


def cell(result: Result, ours: Result | None) -> str:
    s = result.summary
    text = f"{_num(s.median)} [{_num(s.low)}–{_num(s.high)}]"
    if ours is not None and ours is not result and s.median > 0 and ours.summary.median > 0:
        ratio = (ours.summary.median / s.median if result.higher_is_better
                 else s.median / ours.summary.median)
        text += f"\nleaseq {ratio:.2f}×"
    return text


def _num(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _repeats(results: Sequence[Result]) -> str:
    counts = sorted({len(r.summary.runs) for r in results})
    return "/".join(str(c) for c in counts) or "0"


def markdown(results: Sequence[Result], store: str) -> str:
    """The same table as Markdown, for docs/benchmarks.md."""
    mine = [r for r in results if r.store == store]
    systems = list(dict.fromkeys(r.system for r in mine))
    by = {(r.scenario, r.system): r for r in mine}
    lines = [f"| {store} | unit | " + " | ".join(systems) + " |",
             "| --- | --- | " + " | ".join("---:" for _ in systems) + " |"]
    for scenario in dict.fromkeys(r.scenario for r in mine):
        ours = by.get((scenario, "leaseq"))
        cells = []
        for name in systems:
            result = by.get((scenario, name))
            cells.append("" if result is None else cell(result, ours).replace("\n", "<br>"))
        unit = next(r.unit for r in mine if r.scenario == scenario)
        lines.append(f"| {scenario} | {unit} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
