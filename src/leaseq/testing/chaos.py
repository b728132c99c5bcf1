"""The fault-injection harness behind ``scripts/chaos`` and ``tests/faults`` (issue 7).

A *scenario* is a function ``run(r: Run) -> None``: it breaks something on purpose (SIGKILL,
SIGSTOP, a restarted server, a skewed clock, hostile input) and then measures, from the store's
records, its journal and an effects ledger, the promise "no job lost, no stale write, poison
stopped". It fills ``r.counts`` (the table's columns) and calls ``r.check`` once per invariant.

Effects are counted, not guessed: a handler records each side effect in ``Ledger`` under the
key ``job id + effect name`` (a UNIQUE column); a second attempt at a key is kept as a repeat
with the lease epoch that made it. A repeat by a *later* epoch of a job whose earlier lease was
lost (its worker was killed) is a "fenced re-run", which at-least-once execution allows and the
table reports on its own column; a repeat by the *same* epoch, or by an epoch after the one that
finished the job, is a duplicate effect, which is a violation.

Every run keeps a JSON-lines event log; a failing run keeps its whole folder (store file, ledger,
worker logs, events) and prints the seed that replays it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

from leaseq.job import Job, is_terminal
from leaseq.queue import Queue
from leaseq.stores import connect
from leaseq.stores.base import Store
from leaseq.validate import redact_url

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
Scenario = Callable[["Run"], None]


class Skip(Exception):
    """The scenario cannot run here (a tool or server is missing); the reason is reported."""


# --- the effects ledger --------------------------------------------------------------------

LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    key TEXT NOT NULL UNIQUE, job_id TEXT NOT NULL, effect TEXT NOT NULL,
    lease_epoch INTEGER NOT NULL, worker TEXT, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS repeats (
    key TEXT NOT NULL, job_id TEXT NOT NULL, effect TEXT NOT NULL,
    lease_epoch INTEGER NOT NULL, worker TEXT, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS facts (name TEXT NOT NULL, job_id TEXT, value TEXT);
"""


class Ledger:
    """Side effects under a UNIQUE key, shared by every process of a run (a SQLite file in
    WAL mode: a process killed mid-write leaves it consistent)."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                                     timeout=60)
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.executescript(LEDGER_SCHEMA)

    def record(self, job: Job, effect: str, worker: str | None = None) -> bool:
        """Make the effect once per key; True the first time, False for a repeat (kept)."""
        row = (f"{job.id}\x1f{effect}", job.id, effect, job.lease_epoch, worker, time.time())
        with self._lock:
            try:
                self._conn.execute("INSERT INTO effects VALUES (?, ?, ?, ?, ?, ?)", row)
                return True
            except sqlite3.IntegrityError:
                self._conn.execute("INSERT INTO repeats VALUES (?, ?, ?, ?, ?, ?)", row)
                return False

    def fact(self, name: str, job_id: str | None = None, value: Any = None) -> None:
        """Something a handler saw that the scenario checks afterwards (e.g. its clock)."""
        with self._lock:
            self._conn.execute("INSERT INTO facts VALUES (?, ?, ?)",
                               (name, job_id, json.dumps(value)))

    def facts(self, name: str) -> list[tuple[str | None, Any]]:
        with self._lock:
            rows = self._conn.execute("SELECT job_id, value FROM facts WHERE name = ?", (name,))
            return [(job_id, json.loads(value)) for job_id, value in rows.fetchall()]

    def effects(self) -> dict[str, int]:
        """Job id → epoch of its first recorded effect."""
        with self._lock:
            rows = self._conn.execute("SELECT job_id, lease_epoch FROM effects").fetchall()
        return dict(rows)

    def repeats(self) -> list[tuple[str, int]]:
        with self._lock:
            return self._conn.execute("SELECT job_id, lease_epoch FROM repeats").fetchall()

    def classify(self, jobs: Mapping[str, Job]) -> tuple[int, int, list[str]]:
        """``(duplicates, fenced_reruns, details)`` over every repeat, see the module doc."""
        first = self.effects()
        duplicates, reruns, details = 0, 0, []
        for job_id, epoch in self.repeats():
            job = jobs.get(job_id)
            finished_at = job.lease_epoch if job is not None and is_terminal(job.status) else None
            if epoch == first.get(job_id) or (finished_at is not None and epoch > finished_at):
                duplicates += 1
                details.append(f"{job_id}: effect repeated by epoch {epoch} "
                               f"(first by {first.get(job_id)}, finished at {finished_at})")
            else:
                reruns += 1
        return duplicates, reruns, details

    def close(self) -> None:
        with self._lock:
            self._conn.close()


# --- one scenario on one store -------------------------------------------------------------


@dataclass
class Counts:
    """The table's columns for one scenario on one store."""

    jobs_in: int = 0
    terminal_out: int = 0
    lost: int = 0
    duplicate_effects: int = 0
    fenced_reruns: int = 0
    stale_refused: int = 0
    stale_accepted: int = 0
    max_attempts_seen: int = 0


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class Outcome:
    scenario: str
    store: str
    counts: Counts
    checks: list[Check]
    seconds: float
    folder: str
    skipped: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and all(c.ok for c in self.checks)


@dataclass
class Run:
    """What a scenario gets: its store, sizes, randomness, folder, event log and checks."""

    scenario: str
    store_kind: str  # "sqlite" or "postgres"
    base_url: str | None
    quick: bool
    seed: int
    folder: str
    tasks_dir: str
    counts: Counts = field(default_factory=Counts)
    checks: list[Check] = field(default_factory=list)
    rng: random.Random = field(init=False)
    _cleanups: list[Callable[[], None]] = field(default_factory=list)
    _url: str | None = None
    _events: Any = None

    def __post_init__(self) -> None:
        self.rng = random.Random(f"{self.seed}:{self.scenario}:{self.store_kind}")
        self._events = open(os.path.join(self.folder, "events.jsonl"), "a",  # noqa: SIM115
                            encoding="utf-8")

    # sizes and checks

    def size(self, quick: int, full: int) -> int:
        return quick if self.quick else full

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, bool(ok), detail if not ok else ""))
        self.log("check", name=name, ok=bool(ok), detail=detail[:2000])
        return bool(ok)

    def log(self, event: str, **data: Any) -> None:
        line = {"t": round(time.time(), 3), "scenario": self.scenario,
                "store": self.store_kind, "event": event, **data}
        self._events.write(json.dumps(line, default=str) + "\n")
        self._events.flush()

    # the store

    @property
    def url(self) -> str:
        """This scenario's own store: a file in its folder, or its own PostgreSQL schema."""
        if self._url is None:
            if self.store_kind == "sqlite":
                self._url = "sqlite:///" + os.path.join(self.folder, "store.db")
            else:
                schema = f"chaos_{self.scenario.replace('-', '_')[:20]}_{uuid.uuid4().hex[:8]}"
                base = self.base_url or DEFAULT_POSTGRES_URL
                self._url = f"{base}{'&' if urlsplit(base).query else '?'}schema={schema}"
                self.on_cleanup(self._drop_schema)
        return self._url

    def open(self, url: str | None = None, **options: Any) -> Store:
        store = connect(url or self.url, **options)
        self.on_cleanup(store.close)
        return store

    def _drop_schema(self) -> None:
        with contextlib.suppress(Exception):
            store = connect(self.url)
            try:
                store.drop()
            finally:
                store.close()

    def ledger(self) -> Ledger:
        ledger = Ledger(os.path.join(self.folder, "effects.db"))
        self.on_cleanup(ledger.close)
        return ledger

    def on_cleanup(self, fn: Callable[[], None]) -> None:
        self._cleanups.append(fn)

    def close(self, keep_store: bool) -> None:
        for fn in reversed(self._cleanups):
            if keep_store and fn == self._drop_schema:
                continue
            with contextlib.suppress(Exception):
                fn()
        self._events.close()

    # worker processes

    def worker(self, name: str, *, concurrency: int = 4, url: str | None = None,
               env: Mapping[str, str] | None = None, grace_s: float = 10.0,
               sweep_every_s: float = 0.5, log_level: str = "info",
               extra: Sequence[str] = ()) -> WorkerProc:
        proc = WorkerProc(self, name, url or self.url, concurrency, dict(env or {}), grace_s,
                          sweep_every_s, log_level, list(extra))
        self.on_cleanup(proc.kill_hard)
        return proc

    def worker_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (self.tasks_dir,
                                                        env.get("PYTHONPATH")) if p)
        env["CHAOS_EFFECTS"] = os.path.join(self.folder, "effects.db")
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra or {})
        return env


class WorkerProc:
    """``python -m leaseq.cli worker chaos_tasks:app …`` as a child we can kill, stop and
    restart; its output goes to a log file in the scenario's folder."""

    def __init__(self, run: Run, name: str, url: str, concurrency: int, env: dict[str, str],
                 grace_s: float, sweep_every_s: float, log_level: str, extra: list[str]):
        self.run, self.name, self.url = run, name, url
        self.env = env
        self.command = [sys.executable, "-m", "leaseq.cli", "worker", "chaos_tasks:app",
                        "--url", url, "--concurrency", str(concurrency), "--grace-s",
                        str(grace_s), "--sweep-every-s", str(sweep_every_s), "--log-level",
                        log_level, *extra]
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.log_path = os.path.join(run.folder, f"worker-{name}.log")

    def start(self) -> WorkerProc:
        self.starts += 1
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        log.write(f"--- start {self.starts} ---\n".encode())
        log.flush()
        self.proc = subprocess.Popen(self.command, env=self.run.worker_env(self.env),
                                     stdout=log, stderr=subprocess.STDOUT,
                                     cwd=self.run.folder, start_new_session=True)
        log.close()
        self.run.log("worker_started", worker=self.name, pid=self.proc.pid, n=self.starts)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)
            self.run.log("signal", worker=self.name, pid=self.pid, signal=int(sig))

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.alive():
            self.signal(signal.SIGKILL)
            self.proc.wait(30)  # type: ignore[union-attr]

    def kill_hard(self) -> None:
        if self.alive():
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGCONT)
            self.kill()

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait for the exit (SIGKILL after ``timeout_s``); the exit status."""
        if self.proc is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def wait(self, timeout_s: float) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def output(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as fh:
            return fh.read()


# --- shared measurements -------------------------------------------------------------------


def all_jobs(q: Queue) -> dict[str, Job]:
    out: dict[str, Job] = {}
    after: str | None = None
    while page := q.list(None, 1000, after):
        out.update((j.id, j) for j in page)
        after = page[-1].id
    return out


def wait_until(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def all_terminal(q: Queue, ids: Iterable[str]) -> Callable[[], bool]:
    wanted = set(ids)

    def done() -> bool:
        counts = q.counts()
        live = counts.get("pending", 0) + counts.get("processing", 0)
        return live == 0 and sum(counts.values()) >= len(wanted)
    return done


def settle(r: Run, q: Queue, ids: Sequence[str], ledger: Ledger | None, *,
           reruns_allowed: bool, effect_expected: Callable[[Job], bool] | None = None
           ) -> dict[str, Job]:
    """The checks every worker scenario shares, from the records and the ledger: no job lost,
    each terminal exactly once in its journal, attempts within the limit, effects unique."""
    jobs = all_jobs(q)
    c = r.counts
    c.jobs_in = len(ids)
    missing = [i for i in ids if i not in jobs]
    live = [i for i in ids if i in jobs and not is_terminal(jobs[i].status)]
    c.terminal_out = sum(1 for i in ids if i in jobs and is_terminal(jobs[i].status))
    c.lost = len(missing) + len(live)
    c.max_attempts_seen = max((jobs[i].attempts for i in ids if i in jobs), default=0)
    over = [i for i in ids if i in jobs and jobs[i].attempts > jobs[i].max_attempts]
    r.check("no job lost (every job terminal)", c.lost == 0,
            f"missing {missing[:5]}, still live {[(i, jobs[i].status) for i in live[:5]]}")
    r.check("attempts ≤ max_attempts", not over, f"over: {over[:5]}")
    finishes = _finishes(q, [i for i in ids if i in jobs])
    twice = [i for i, n in finishes.items() if n != 1 and is_terminal(jobs[i].status)]
    r.check("each job terminal exactly once (journal)", not twice,
            f"{[(i, finishes[i]) for i in twice[:5]]}")
    if ledger is not None:
        dupes, reruns, details = ledger.classify(jobs)
        c.duplicate_effects, c.fenced_reruns = dupes, reruns
        r.check("0 duplicate effects", dupes == 0, "; ".join(details[:5]))
        if not reruns_allowed:
            r.check("0 re-runs (nothing was killed)", reruns == 0, f"{reruns} re-runs")
        expected = effect_expected or (lambda j: j.status == "done")
        have = ledger.effects()
        without = [i for i in ids if i in jobs and expected(jobs[i]) and i not in have]
        r.check("every finished job made its effect", not without, f"{without[:5]}")
    return jobs


_FINISH_EVENTS = ("result_saved", "quarantined", "cancelled")


def _finishes(q: Queue, ids: Sequence[str]) -> dict[str, int]:
    """Per job, how many terminal transitions its journal holds (revivals excluded)."""
    return {i: sum(1 for e in q.journal(i) if e.event in _FINISH_EVENTS) for i in ids}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- running and reporting -----------------------------------------------------------------


def run_scenario(name: str, scenario: Scenario, store_kind: str, base_url: str | None, *,
                 quick: bool, seed: int, root: str, tasks_dir: str, keep: bool = False
                 ) -> Outcome:
    folder = tempfile.mkdtemp(prefix=f"{name}-{store_kind}-", dir=root)
    r = Run(name, store_kind, base_url, quick, seed, folder, tasks_dir)
    r.log("start", seed=seed, quick=quick, url=redact_url(base_url or ""))
    started = time.monotonic()
    skipped = error = None
    try:
        scenario(r)
    except Skip as exc:
        skipped = str(exc)
    except Exception:
        error = traceback.format_exc()
    outcome = Outcome(name, store_kind, r.counts, r.checks, time.monotonic() - started, folder,
                      skipped, error)
    r.log("end", ok=outcome.ok, skipped=skipped, error=error, counts=vars(r.counts))
    r.close(keep_store=not outcome.ok)
    if outcome.ok and not keep:
        shutil.rmtree(folder, ignore_errors=True)
    return outcome


_COLUMNS = [("scenario", 22), ("store", 8), ("result", 7)] + [
    (f.name.replace("_", " ").replace("max attempts seen", "max att"), 0) for f in fields(Counts)
] + [("secs", 5)]


def table(outcomes: Sequence[Outcome]) -> str:
    heads = [name for name, _ in _COLUMNS]
    rows = []
    for o in outcomes:
        result = "skip" if o.skipped else ("ok" if o.ok else "FAIL")
        rows.append([o.scenario, o.store, result, *(str(v) for v in vars(o.counts).values()),
                     f"{o.seconds:.1f}"])
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
              for i, h in enumerate(heads)]
    lines = [" | ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True))]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def details(outcomes: Sequence[Outcome]) -> str:
    out = []
    for o in outcomes:
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
    parser = argparse.ArgumentParser(prog="scripts/chaos", description=__doc__.split("\n")[0])
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
    outcomes = []
    for kind, url in stores_from(args.store):
        reason = postgres_reachable(url) if kind == "postgres" and url else None
        for name, scenario in chosen:
            if reason:
                outcomes.append(Outcome(name, kind, Counts(), [], 0.0, root, skipped=reason))
                continue
            o = run_scenario(name, scenario, kind, url, quick=not args.full, seed=seed,
                             root=root, tasks_dir=tasks_dir, keep=args.keep)
            print(f"  {name:<22} {kind:<8} {'skip' if o.skipped else 'ok' if o.ok else 'FAIL'}"
                  f"  {o.seconds:.1f} s", flush=True)
            outcomes.append(o)
    print(table(outcomes))
    text = details(outcomes)
    if text:
        print(text)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        print(f"chaos: {len(failed)} scenario run(s) violated an invariant; replay with "
              f"--seed {seed}; history kept in {root}")
        return 1
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0
