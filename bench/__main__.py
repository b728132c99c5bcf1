"""``python -m bench [--quick] [--full] [--store URL ...] [--compare] [--json-out PATH]``.

Prints a table per store and writes the JSON of the run (default: bench/results/). See
docs/benchmarks.md for what each scenario measures.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import subprocess
import sys
import time

from rich.console import Console

from bench import report
from bench.adapters import COMPETITORS
from bench.adapters.leaseq import ID_SHAPES, WORKER_MODES, real_worker_available
from bench.runner import FULL_SET, LIMITED_DRAINS, run_all
from bench.scenarios import Plan
from bench.targets import DEFAULT_POSTGRES_URL, kind_of, postgres_reachable

#: pip requirement and import name of each competitor, installed on demand by --compare.
REQUIREMENTS = {
    "pgqueuer": ("pgqueuer[asyncpg]", "pgqueuer"),
    "procrastinate": ("procrastinate", "procrastinate"),
    "huey": ("huey", "huey"),
}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller N (a few minutes)")
    size.add_argument("--full", action="store_true", help="also the 1M backlog, longer RSS run")
    size.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # smoke test
    p.add_argument("--store", action="append", metavar="URL",
                   help="store URL (repeatable); default: SQLite in a temporary folder and "
                        f"{DEFAULT_POSTGRES_URL} when reachable, MongoDB when "
                        "LEASEQ_TEST_MONGODB_URL is set")
    p.add_argument("--compare", action="store_true",
                   help="also PgQueuer, Procrastinate, Huey (installed on demand) and the "
                        "raw-SQL ceiling")
    p.add_argument("--only", action="append", metavar="SYSTEM",
                   help="run only these systems (leaseq, raw-sql, pgqueuer, procrastinate, huey)")
    p.add_argument("--json-out", metavar="PATH", help="where to write the JSON")
    p.add_argument("--worker", choices=WORKER_MODES, default="auto",
                   help="leaseq's drain worker: the real one, or the Queue-API stand-in")
    p.add_argument("--ids", choices=ID_SHAPES, default="counter",
                   help="leaseq's job ids: j0, j1, … (default) or random hex, as UUIDs would "
                        "lie in an index")
    p.add_argument("--concurrency", type=int,
                   help="handler slots per worker process (default: leaseq's worker at its own "
                        "default, the others at 16)")
    names = (*FULL_SET, *LIMITED_DRAINS)
    p.add_argument("--scenario", action="append", metavar="NAME", choices=names,
                   help="run only these scenarios (repeatable: " + ", ".join(names) + ")")
    p.add_argument("--repeats", type=int, help="runs per scenario (default 3)")
    p.add_argument("--markdown", action="store_true", help="also print Markdown tables")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    console = Console(width=None if sys.stdout.isatty() else 160)
    plan = Plan.tiny() if args.tiny else Plan.quick() if args.quick else (
        Plan.full() if args.full else Plan())
    overrides = {k: v for k, v in (("concurrency", args.concurrency),
                                   ("repeats", args.repeats)) if v}
    plan = dataclasses.replace(plan, **overrides)
    stores = args.store or default_stores(console)
    systems = ["leaseq"]
    if args.compare:
        systems += ["raw-sql", *COMPETITORS]
        ensure_installed([n for n in COMPETITORS if not args.only or n in args.only], console)
    if args.only:
        systems = [s for s in (*systems, *args.only) if s in args.only]
        systems = list(dict.fromkeys(systems))
    worker = args.worker if args.worker != "auto" else (
        "leaseq" if real_worker_available() else "queue-api")
    console.log(f"stores: {', '.join(stores)}; systems: {', '.join(systems)}; "
                f"leaseq worker: {worker}")
    info = report.machine(stores)
    run = run_all(plan, stores, systems, console, worker, args.scenario, args.ids)
    info["leaseq_worker"] = worker
    info["leaseq_ids"] = args.ids
    info["loadavg_at_end"] = os.getloadavg()
    report.print_tables(run, console, info)
    if args.markdown:
        for store in dict.fromkeys(r.store for r in run.results):
            # Plain print: a console would cut Markdown rows at its width.
            print(report.markdown(run.results, store), flush=True)
    path = args.json_out or default_json_path()
    report.write_json(report.to_json(run, stores, info, sys.argv), path)
    console.log(f"JSON written to {path}")
    return 1 if run.errors else 0


def tool_parser(tool: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of ``python -m bench.<tool>``: its module docstring as the help, ``--store``
    as ``python -m bench`` takes it (``default_stores`` when none is given)."""
    p = argparse.ArgumentParser(prog=f"python -m bench.{tool}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", action="append", metavar="URL",
                   help="store URL (repeatable); default: as python -m bench")
    return p


def default_stores(console: Console) -> list[str]:
    stores = ["sqlite://"]
    why = postgres_reachable(DEFAULT_POSTGRES_URL)
    if why is None:
        stores.append(DEFAULT_POSTGRES_URL)
    else:
        console.log(f"[yellow]PostgreSQL skipped: {why}")
    mongo = os.environ.get("LEASEQ_TEST_MONGODB_URL")
    if mongo and kind_of(mongo) == "mongodb":
        stores.append(mongo)
    return stores


def ensure_installed(names: list[str], console: Console) -> None:
    missing = [REQUIREMENTS[n][0] for n in names
               if importlib.util.find_spec(REQUIREMENTS[n][1]) is None]
    if not missing:
        return
    console.log(f"--compare: installing {', '.join(missing)} into {sys.prefix} with pip")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", *missing], check=True)
    importlib.invalidate_caches()


def default_json_path() -> str:
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    return os.path.join(folder, time.strftime("bench-%Y%m%d-%H%M%S.json"))


if __name__ == "__main__":
    raise SystemExit(main())
