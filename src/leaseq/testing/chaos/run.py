"""One scenario on one store: the ``Run`` a scenario gets (its store, sizes, randomness, folder,
event log and checks), the worker processes it starts, and ``run_scenario``, which runs it and
keeps the history of a failure."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from leaseq.stores import connect
from leaseq.stores.base import Store
from leaseq.testing.chaos.ledger import Ledger
from leaseq.validate import redact_url

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
Scenario = Callable[["Run"], None]


class Skip(Exception):
    """The scenario cannot run here (a tool or server is missing); the reason is reported."""


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
    overlapping_runs: int | None = None
    """Partition scenarios: pairs of runs of one job that overlapped in time."""
    longest_blocked_s: float | None = None
    """Partition scenarios: the longest store call any worker thread made."""
    abandon_after_s: float | None = None
    """Partition scenarios: the longest time from a lease's last confirmation to its
    abandonment by the worker's lease clock."""


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class ScenarioResult:
    """How one scenario went on one store: its counts, its checks, and where its history is."""

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
               extra: Sequence[str] = (), app: str = "chaos_tasks:app") -> WorkerProc:
        proc = WorkerProc(self, name, url or self.url, concurrency, dict(env or {}), grace_s,
                          sweep_every_s, log_level, list(extra), app)
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
    """``python -m leaseq.cli worker chaos_tasks:app …`` (or another ``app``) as a child we
    can kill, stop and restart; its output goes to a log file in the scenario's folder."""

    def __init__(self, run: Run, name: str, url: str, concurrency: int, env: dict[str, str],
                 grace_s: float, sweep_every_s: float, log_level: str, extra: list[str],
                 app: str = "chaos_tasks:app"):
        self.run, self.name, self.url = run, name, url
        self.env = env
        self.command = [sys.executable, "-m", "leaseq.cli", "worker", app,
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
            self.proc.wait(30)  # type: ignore[union-attr]  # alive() means proc was started

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



def run_scenario(name: str, scenario: Scenario, store_kind: str, base_url: str | None, *,
                 quick: bool, seed: int, root: str, tasks_dir: str, keep: bool = False
                 ) -> ScenarioResult:
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
    result = ScenarioResult(name, store_kind, r.counts, r.checks, time.monotonic() - started,
                            folder, skipped, error)
    r.log("end", ok=result.ok, skipped=skipped, error=error, counts=vars(r.counts))
    r.close(keep_store=not result.ok)
    if result.ok and not keep:
        shutil.rmtree(folder, ignore_errors=True)
    return result
