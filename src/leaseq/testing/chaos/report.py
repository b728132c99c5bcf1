"""Running the chosen scenarios on the chosen stores (``main``, behind ``scripts/chaos``) and
reporting them: the table of counts, and for each failure what was violated and where its
history is kept."""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import fields
from urllib.parse import urlsplit

from leaseq.testing.chaos.run import (
    DEFAULT_POSTGRES_URL,
    Counts,
    Scenario,
    ScenarioResult,
    run_scenario,
)
from leaseq.validate import redact_url

_DESCRIPTION = "The fault-injection scenarios and the invariants they check."

_COLUMNS = [("scenario", 22), ("store", 8), ("result", 7)] + [
    (f.name.replace("_", " ").replace("max attempts seen", "max att")
     .replace("overlapping runs", "overlaps").replace("longest blocked s", "blocked s")
     .replace("abandon after s", "abandon s"), 0) for f in fields(Counts)
] + [("secs", 5)]


def table(results: Sequence[ScenarioResult]) -> str:
    heads = [name for name, _ in _COLUMNS]
    rows = []
    for o in results:
        result = "skip" if o.skipped else ("ok" if o.ok else "FAIL")
        rows.append([o.scenario, o.store, result, *(_cell(v) for v in vars(o.counts).values()),
                     f"{o.seconds:.1f}"])
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
              for i, h in enumerate(heads)]
    lines = [" | ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True))]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def _cell(value: object) -> str:
    """A count as the table shows it: ``-`` where the scenario does not measure it."""
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def details(results: Sequence[ScenarioResult]) -> str:
    out = []
    for o in results:
        if o.skipped:
            out.append(f"{o.scenario} on {o.store}: skipped: {o.skipped}")
        for check in o.checks:
            if not check.ok:
                out.append(f"{o.scenario} on {o.store}: VIOLATED {check.name}: {check.detail}")
        if o.error:
            out.append(f"{o.scenario} on {o.store}: ERROR\n{o.error}")
        if not o.ok:
            out.append(f"  history kept in {o.folder} (events.jsonl, worker logs, effects.db)")
    return "\n".join(out)


def postgres_reachable(url: str) -> str | None:
    """None when something listens at the URL's host and port, else the reason."""
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5432), 3).close()
    except OSError as exc:
        return f"PostgreSQL not reachable at {redact_url(url)}: {exc}"
    return None


def stores_from(urls: Sequence[str]) -> Iterator[tuple[str, str | None]]:
    if not urls:
        yield "sqlite", None
        pg = os.environ.get("LEASEQ_TEST_POSTGRES_URL") or DEFAULT_POSTGRES_URL
        yield "postgres", pg
        return
    for url in urls:
        scheme = urlsplit(url).scheme.lower() if "://" in url else url.lower()
        if scheme == "sqlite":
            yield "sqlite", None
        elif scheme in ("postgresql", "postgres"):
            yield "postgres", url if "://" in url else DEFAULT_POSTGRES_URL
        else:
            raise SystemExit(f"chaos: unsupported store {redact_url(url)} (sqlite or postgresql)")


def main(argv: Sequence[str] | None, scenarios: Mapping[str, Scenario], tasks_dir: str) -> int:
    parser = argparse.ArgumentParser(prog="scripts/chaos", description=_DESCRIPTION)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small sizes (default)")
    mode.add_argument("--full", action="store_true", help="the issue's full sizes")
    parser.add_argument("--store", action="append", default=[], metavar="URL",
                        help="sqlite, or a postgresql:// URL (repeat); default both")
    parser.add_argument("--seed", type=int, default=None, help="replay a run's seed")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only scenarios whose name or number matches (repeat)")
    parser.add_argument("--keep", action="store_true", help="keep every run's folder")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**9)
    chosen = [(n, s) for i, (n, s) in enumerate(scenarios.items(), 1)
              if not args.only or any(o == str(i) or o in n for o in args.only)]
    root = tempfile.mkdtemp(prefix="leaseq-chaos-")
    print(f"chaos: seed {seed}, {'full' if args.full else 'quick'}, history in {root}",
          flush=True)
    results = []
    for kind, url in stores_from(args.store):
        reason = postgres_reachable(url) if kind == "postgres" and url else None
        for name, scenario in chosen:
            if reason:
                results.append(ScenarioResult(name, kind, Counts(), [], 0.0, root,
                                              skipped=reason))
                continue
            o = run_scenario(name, scenario, kind, url, quick=not args.full, seed=seed,
                             root=root, tasks_dir=tasks_dir, keep=args.keep)
            print(f"  {name:<22} {kind:<8} {'skip' if o.skipped else 'ok' if o.ok else 'FAIL'}"
                  f"  {o.seconds:.1f} s", flush=True)
            results.append(o)
    print(table(results))
    text = details(results)
    if text:
        print(text)
    failed = [o for o in results if not o.ok]
    if failed:
        print(f"chaos: {len(failed)} scenario run(s) violated an invariant; replay with "
              f"--seed {seed}; history kept in {root}")
        return 1
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0
