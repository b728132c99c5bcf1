"""``leaseq demo``: a fetch → thumbnail pipeline under real failures, a crash and a replay.

On a fresh SQLite file (or ``--url``): enqueue the fetch jobs, run worker processes, SIGKILL one
while it holds jobs and start a replacement, replay a producer batch (it must create nothing),
wait until every job is terminal, then count — from the journal and the effect ledger, not from
what the demo expects — what was done, retried, quarantined, reclaimed, duplicated and lost.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import sqlite3
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from leaseq.app import App
from leaseq.demo_tasks import build_app
from leaseq.job import JournalEntry, is_terminal
from leaseq.queue import Queue
from leaseq.worker import Worker, WorkerConfig

POLL_S = 0.2
INVALID_JOBS = 3
"""Jobs queued for a task that no longer exists (renamed): quarantined as invalid."""


@dataclass(frozen=True)
class DemoConfig:
    url: str | None = None
    """Store URL. Defaults to a fresh SQLite file in a temporary folder."""
    jobs: int = 2000
    """Jobs in the pipeline: half fetches, each followed by a thumbnail. Defaults to 2,000."""
    workers: int = 2
    """Worker processes; one is SIGKILLed mid-run and replaced. Defaults to 2."""
    concurrency: int = 8
    """Slots per worker process. Defaults to 8."""
    kill_at: float = 0.3
    """Share of jobs finished when a worker is SIGKILLed. Defaults to 0.3."""
    replay_share: float = 0.2
    """Share of the fetch jobs the producer sends again. Defaults to 0.2."""
    timeout_s: float = 55.0
    """Give up waiting (jobs still live are then counted as lost). Defaults to 55 s."""
    keep: bool = False
    """Keep the temporary folder (databases, worker logs). Defaults to False."""
    live: bool = True
    """Show live progress on the terminal. Defaults to True."""


def _worker_main(url: str, effects_path: str, prefix: str, concurrency: int,
                 log_path: str) -> None:
    logging.basicConfig(filename=log_path, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the demo, which stops us
    app = build_app(url, effects_path, prefix)
    # No cross-process wake-ups on SQLite: a short idle wait keeps the pipeline's tail short.
    config = WorkerConfig(concurrency=concurrency, grace_s=5.0, sweep_every_s=1.0,
                          idle_max_s=0.1)
    worker = Worker(app, config)
    worker.run(handle_signals=True)
    logging.shutdown()
    os._exit(0)  # a handler given back at shutdown may still be running in a pool thread


class _Run:
    """One demo run: its folder, store, app, worker processes and what happened."""

    def __init__(self, config: DemoConfig, console: Console):
        self.config = config
        self.console = console
        self.folder = tempfile.mkdtemp(prefix="leaseq-demo-")
        self.url = config.url or f"sqlite:///{os.path.join(self.folder, 'demo.db')}"
        self.effects_path = os.path.join(self.folder, "effects.db")
        self.prefix = f"demo-{uuid.uuid4().hex[:8]}"
        self.app: App = build_app(self.url, self.effects_path, self.prefix)
        self.fetch_q = self.app.queue(f"{self.prefix}.fetch")
        self.thumb_q = self.app.queue(f"{self.prefix}.thumbnail")
        self.ctx = multiprocessing.get_context("spawn")
        self.processes: list[Any] = []
        self.events: list[str] = []
        self.killed: dict[str, Any] | None = None
        self.replay: dict[str, int] | None = None
        self.sources = [f"img-{i:05d}" for i in range(max(config.jobs // 2, 10))]

    def note(self, text: str) -> None:
        self.events.append(text)
        if self.config.live:
            self.console.print(f"[cyan]•[/cyan] {text}")

    # --- producer ------------------------------------------------------------------------

    def batch(self, sources: list[str]) -> list[tuple[str, Any]]:
        fetch = self.app.tasks["fetch"]
        return [fetch.spec(source=s, size_kb=40 + i % 200, job_id=s)
                for i, s in enumerate(sources)]

    def produce(self) -> Counter[str]:
        outcomes: Counter[str] = Counter()
        for start in range(0, len(self.sources), 500):
            results = self.app.enqueue_many(self.batch(self.sources[start:start + 500]))
            outcomes.update(r.outcome.value for r in results)
        for i in range(INVALID_JOBS):  # queued under the task's old name
            self.fetch_q.enqueue(f"legacy-{i}", {"url": f"http://example/{i}"}, task="download")
        return outcomes

    def replay_batch(self) -> None:
        """The producer crashed after sending and sends the same batch again."""
        sources = self.sources[: max(1, int(len(self.sources) * self.config.replay_share))]
        results = self.app.enqueue_many(self.batch(sources))
        self.replay = dict(Counter(r.outcome.value for r in results))
        shown = ", ".join(f"{k} {v}" for k, v in sorted(self.replay.items()))
        self.note(f"producer replayed a batch of {len(sources)} fetch jobs → {shown}")

    # --- workers -------------------------------------------------------------------------

    def start_worker(self) -> Any:
        index = len(self.processes)
        log_path = os.path.join(self.folder, f"worker-{index}.log")
        process = self.ctx.Process(target=_worker_main, name=f"demo-worker-{index}", args=(
            self.url, self.effects_path, self.prefix, self.config.concurrency, log_path))
        process.start()
        self.processes.append(process)
        return process

    def kill_one(self) -> bool:
        """SIGKILL a worker while it holds jobs; start a replacement. False: not yet."""
        victim = next(p for p in self.processes if p.is_alive())
        if not self.held_by(victim.pid):
            return False
        os.kill(victim.pid, signal.SIGKILL)
        victim.join()
        held = self.held_by(victim.pid)  # again: it may have claimed more before it died
        replacement = self.start_worker()
        self.killed = {"pid": victim.pid, "held": len(held), "replacement_pid": replacement.pid}
        self.note(f"SIGKILLed worker pid {victim.pid} holding {len(held)} job(s); started "
                  f"replacement pid {replacement.pid}")
        return True

    def held_by(self, pid: int) -> list[str]:
        return [j.id for q in (self.fetch_q, self.thumb_q)
                for j in q.list("processing", limit=10_000)
                if j.worker_id and f":{pid}:" in j.worker_id]

    def stop_workers(self) -> None:
        for process in self.processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in self.processes:
            process.join(max(deadline - time.monotonic(), 0.1))
            if process.is_alive():
                process.kill()
                process.join()

    # --- progress ------------------------------------------------------------------------

    def tally(self) -> tuple[int, int]:
        """(finished, total) over both queues."""
        total = finished = 0
        for queue in (self.fetch_q, self.thumb_q):
            for status, n in queue.counts().items():
                total += n
                finished += n if is_terminal(status) else 0
        return finished, total

    def drive(self, on_tick: Callable[[int, int], None]) -> None:
        started = time.monotonic()
        while time.monotonic() - started < self.config.timeout_s:
            finished, total = self.tally()
            on_tick(finished, total)
            expected = len(self.sources) + INVALID_JOBS
            share = finished / max(expected * 2, 1)
            if self.killed is None and share >= self.config.kill_at and finished < total:
                self.kill_one()
            if self.replay is None and (self.killed is not None or finished == total):
                self.replay_batch()
                continue  # count again before deciding we are done
            if finished == total:
                if self.killed is None:
                    self.note("every job finished before a worker held one to kill")
                return
            time.sleep(POLL_S)
        self.note(f"timed out after {self.config.timeout_s:.0f} s with jobs still live")


def run_demo(config: DemoConfig | None = None, console: Console | None = None) -> dict[str, Any]:
    """Run the demo; returns the summary (see ``summarize``)."""
    config = config or DemoConfig()
    console = console or Console(stderr=not config.live)
    run = _Run(config, console)
    started = time.monotonic()
    try:
        created = run.produce()
        run.note(f"enqueued {created['created']} fetch jobs (+{INVALID_JOBS} for a renamed task) "
                 f"into {run.url if config.url else 'a fresh SQLite file'}")
        for _ in range(config.workers):
            run.start_worker()
        run.note(f"started {config.workers} worker processes × {config.concurrency} slots")
        _drive_with_progress(run)
        elapsed = time.monotonic() - started
        run.stop_workers()
        summary = summarize(run, elapsed)
    finally:
        run.stop_workers()
        run.app.store.close()
        if not config.keep:
            shutil.rmtree(run.folder, ignore_errors=True)
    if config.live:
        print_summary(console, summary)
    return summary


def _drive_with_progress(run: _Run) -> None:
    if not run.config.live:
        run.drive(lambda finished, total: None)
        return
    columns = (TextColumn("[bold]jobs finished"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=run.console, transient=False) as progress:
        bar = progress.add_task("jobs", total=len(run.sources))
        run.drive(lambda finished, total: progress.update(bar, completed=finished, total=total))


# --- the count -----------------------------------------------------------------------------


def summarize(run: _Run, elapsed_s: float) -> dict[str, Any]:
    """Count what happened from the store (records and journals) and the effect ledger."""
    jobs = [j for q in (run.fetch_q, run.thumb_q) for j in _every_job(q)]
    journals = {(j.queue, j.id): (run.fetch_q if j.queue == run.fetch_q.name else run.thumb_q
                                  ).journal(j.id) for j in jobs}
    statuses = Counter(j.status for j in jobs)
    reasons = Counter(j.failure for j in jobs if j.status == "failed")
    thumbs = {j.id for j in jobs if j.queue == run.thumb_q.name}
    missing_followups = sum(1 for j in jobs if j.queue == run.fetch_q.name
                            and j.status == "done" and f"thumb:{j.id}" not in thumbs)
    live = sum(1 for j in jobs if not is_terminal(j.status))
    retries = sum(1 for events in journals.values() for e in events
                  if e.event == "retry_scheduled")
    retried_jobs = sum(1 for events in journals.values()
                       if any(e.event == "retry_scheduled" for e in events))
    ledger = _ledger(run.effects_path, journals)
    finished = sum(n for s, n in statuses.items() if is_terminal(s))
    return {
        "jobs": len(jobs),
        "done": statuses.get("done", 0),
        "retried": retried_jobs,
        "retries": retries,
        "quarantined": sum(reasons.values()),
        "quarantined_by_reason": dict(sorted(reasons.items())),
        "reclaimed": sum(_expired_attempts(events) for events in journals.values()),
        "duplicate_effects": ledger["duplicates"],
        "repeated_effects_absorbed": ledger["absorbed"],
        "effects": ledger["effects"],
        "lost": live + missing_followups,
        "replay": run.replay or {},
        "killed_worker": run.killed,
        "workers_started": len(run.processes),
        "elapsed_s": round(elapsed_s, 2),
        "jobs_per_s": round(finished / elapsed_s, 1) if elapsed_s else 0.0,
        "store": run.url if run.config.url else "sqlite (temporary file)",
        "folder": run.folder if run.config.keep else None,
    }


def _every_job(queue: Queue) -> list[Any]:
    jobs: list[Any] = []
    after = None
    while page := queue.list(limit=1000, after_id=after):
        jobs.extend(page)
        after = page[-1].id
    return jobs


_ENDS_ATTEMPT = {"result_saved", "retry_scheduled", "snoozed", "quarantined", "cancelled"}


def _expired_attempts(events: list[JournalEntry]) -> int:
    """Attempts that ended because their lease ran out (the worker died): a ``reclaimed`` or
    ``quarantined (expired)`` event, or a claim that took over an attempt that never ended."""
    count = 0
    open_attempt = False
    for e in events:
        if e.event == "claimed":
            count += open_attempt  # the previous attempt never ended: its lease expired
            open_attempt = True
        elif e.event == "reclaimed" or (e.event == "quarantined"
                                        and (e.reason or "").startswith("expired")):
            count += open_attempt
            open_attempt = False
        elif e.event in _ENDS_ATTEMPT:
            open_attempt = False
    return count


def _ledger(path: str, journals: dict[tuple[str, str], list[JournalEntry]]) -> dict[str, int]:
    """Effects made, repeats absorbed by the effect key, and real duplicates.

    A repeat is legitimate when the attempt that made the effect first never finished (it was
    killed, or lost its lease): the job had to run again. It is a duplicate when that first
    attempt *did* finish the job — the work ran after it was done — or when one subject got the
    same kind of effect under two different keys (a replay that made a second job).
    """
    if not os.path.exists(path):
        return {"effects": 0, "absorbed": 0, "duplicates": 0}
    finished_epochs = {(job_id, e.lease_epoch) for (_, job_id), events in journals.items()
                       for e in events if e.event == "result_saved"}
    with sqlite3.connect(path) as db:
        effects = db.execute("SELECT count(*) FROM effects").fetchone()[0]
        twice_by_subject = db.execute(
            "SELECT count(*) FROM (SELECT kind, subject FROM effects GROUP BY kind, subject "
            "HAVING count(*) > 1)").fetchone()[0]
        repeats = db.execute(
            "SELECT e.job_id, e.lease_epoch, r.lease_epoch FROM effect_repeats r "
            "JOIN effects e ON e.key = r.key").fetchall()
    after_finish = sum(1 for job_id, first, again in repeats
                       if (job_id, first) in finished_epochs or first == again)
    return {"effects": effects, "absorbed": len(repeats) - after_finish,
            "duplicates": twice_by_subject + after_finish}


def print_summary(console: Console, s: dict[str, Any]) -> None:
    table = Table(title="leaseq demo — summary", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    by_reason = ", ".join(f"{k} {v}" for k, v in s["quarantined_by_reason"].items()) or "none"
    killed = s["killed_worker"] or {}
    rows = [
        ("jobs", f"{s['jobs']} (fetch → thumbnail)"),
        ("done", str(s["done"])),
        ("retried", f"{s['retried']} jobs ({s['retries']} retries)"),
        ("quarantined", f"{s['quarantined']} ({by_reason})"),
        ("reclaimed", f"{s['reclaimed']} (worker pid {killed.get('pid')} SIGKILLed holding "
                      f"{killed.get('held')} job(s))"),
        ("replayed batch", ", ".join(f"{k} {v}" for k, v in s["replay"].items())),
        ("effects", f"{s['effects']} made, {s['repeated_effects_absorbed']} repeats absorbed "
                    "by their effect key"),
        ("duplicate effects", str(s["duplicate_effects"])),
        ("lost", str(s["lost"])),
        ("elapsed", f"{s['elapsed_s']:.1f} s ({s['jobs_per_s']} jobs/s)"),
    ]
    if s["folder"]:
        rows.append(("kept", f"{s['folder']} (demo.db, effects.db, worker logs)"))
    for row in rows:
        table.add_row(*row)
    console.print(table)
    ok = s["lost"] == 0 and s["duplicate_effects"] == 0
    colour = "green" if ok else "red"
    console.print(f"[bold {colour}]lost {s['lost']}, duplicate effects "
                  f"{s['duplicate_effects']}[/bold {colour}]")
