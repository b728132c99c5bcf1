"""One demo run: its folder, store, app, producer, worker processes, and the script it follows.

The script: enqueue the first half of the fetch jobs; start the workers; once ``kill_at`` of
the jobs are finished (at the latest when that first half is), request the crash and send the
rest, so work remains; SIGKILL the worker parked at the crash point and start a replacement;
replay a producer batch (it must create nothing); wait until every job is terminal.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from leaseq.app import App
from leaseq.demo.summary import print_summary, summarize
from leaseq.demo.tasks import CrashPoint, build_app
from leaseq.job import JobSpec, is_terminal
from leaseq.worker import Worker, WorkerConfig

POLL_S = 0.2
INVALID_JOBS = 3
"""Jobs queued for a task that no longer exists (renamed): quarantined as invalid."""
BATCH = 500
"""Jobs per ``enqueue_many`` call of the producer."""


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
    """Share of jobs finished when the crash is requested (at the latest once the first half
    of the fetch jobs, all the producer sends before the crash, is finished). Defaults to 0.3."""
    replay_share: float = 0.2
    """Share of the fetch jobs the producer sends again. Defaults to 0.2."""
    timeout_s: float = 55.0
    """Give up waiting (jobs still live are then counted as lost). Defaults to 55 s."""
    keep: bool = False
    """Keep the temporary folder (databases, worker logs). Defaults to False."""
    live: bool = True
    """Show live progress on the terminal. Defaults to True."""


def _worker_main(url: str, folder: str, effects_path: str, prefix: str, concurrency: int,
                 log_path: str) -> None:
    logging.basicConfig(filename=log_path, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the demo, which stops us
    app = build_app(url, effects_path, prefix, crash=CrashPoint(folder))
    # No cross-process wake-ups on SQLite: a short idle wait keeps the pipeline's tail short.
    config = WorkerConfig(concurrency=concurrency, grace_s=5.0, sweep_every_s=1.0,
                          idle_max_s=0.1)
    worker = Worker(app, config)
    _stop_when_orphaned(worker)
    worker.run(handle_signals=True)
    logging.shutdown()
    os._exit(0)  # a handler given back at shutdown may still be running in a pool thread


def _stop_when_orphaned(worker: Worker) -> None:
    """Stop the worker once the demo's process is gone: SIGKILLed or OOM-killed, it can no
    longer stop its workers, and nothing else would."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    sentinel = parent.sentinel

    def watch() -> None:
        multiprocessing.connection.wait([sentinel])  # ready once the parent has exited
        worker.request_stop()

    threading.Thread(target=watch, name="demo-parent-watch", daemon=True).start()


class DemoRun:
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
        self.crash = CrashPoint(self.folder)
        self.ctx = multiprocessing.get_context("spawn")
        self.processes: list[Any] = []
        self.events: list[str] = []
        self.crash_requested = False
        self.killed: dict[str, Any] | None = None
        self.replay: dict[str, int] | None = None
        self.sources = [f"img-{i:05d}" for i in range(max(config.jobs // 2, 10))]
        # Sent after the crash is requested, so that work remains for the crash point to stop.
        self.held_back = self.sources[len(self.sources) // 2:]

    def note(self, text: str) -> None:
        self.events.append(text)
        if self.config.live:
            self.console.print(f"[cyan]•[/cyan] {text}")

    @property
    def expected_jobs(self) -> int:
        """Fetches, their thumbnails, and the invalid jobs: what the run ends with at most."""
        return len(self.sources) * 2 + INVALID_JOBS

    @property
    def legacy_ids(self) -> list[str]:
        """The ids of the jobs queued for the renamed task."""
        return [f"legacy-{i}" for i in range(INVALID_JOBS)]

    # --- producer ------------------------------------------------------------------------

    def batch(self, sources: list[str]) -> list[tuple[str, JobSpec]]:
        fetch = self.app.tasks["fetch"]
        return [fetch.spec(source=s, size_kb=40 + i % 200, job_id=s)
                for i, s in enumerate(sources)]

    def send(self, sources: list[str]) -> Counter[str]:
        outcomes: Counter[str] = Counter()
        for start in range(0, len(sources), BATCH):
            results = self.app.enqueue_many(self.batch(sources[start:start + BATCH]))
            outcomes.update(r.outcome.value for r in results)
        return outcomes

    def produce(self) -> Counter[str]:
        """The first half of the fetch jobs, and a few for a task that was renamed."""
        outcomes = self.send(self.sources[:len(self.sources) - len(self.held_back)])
        for i, job_id in enumerate(self.legacy_ids):  # queued under the task's old name
            self.fetch_q.enqueue(job_id, {"url": f"http://example/{i}"}, task="download")
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
            self.url, self.folder, self.effects_path, self.prefix, self.config.concurrency,
            log_path))
        self.processes.append(process)  # before it starts: a SIGTERM meanwhile still stops it
        with _starting_children(self.folder):
            process.start()
        return process

    def request_crash(self) -> None:
        """Arm the crash point, then send the held-back jobs: a handler will start after the
        request, and the first one to do so waits for its SIGKILL."""
        self.crash.request()
        self.crash_requested = True
        sent = self.send(self.held_back)
        self.note(f"producer sent the other {sum(sent.values())} fetch jobs; crash armed: the "
                  "next handler to start waits there for its SIGKILL")

    def kill_victim(self) -> None:
        """SIGKILL the worker parked at the crash point (once there is one); start a
        replacement."""
        pid = self.crash.victim_pid()
        victim = next((p for p in self.processes if p.pid == pid), None)
        if victim is None:
            return
        os.kill(victim.pid, signal.SIGKILL)
        victim.join()
        held = self.held_by(victim.pid)
        replacement = self.start_worker()
        self.killed = {"pid": victim.pid, "held": len(held), "replacement_pid": replacement.pid}
        self.note(f"SIGKILLed worker pid {victim.pid} holding {len(held)} job(s); started "
                  f"replacement pid {replacement.pid}")

    def held_by(self, pid: int) -> list[str]:
        return [j.id for q in (self.fetch_q, self.thumb_q) for j in q.iter_jobs("processing")
                if j.worker_id and f":{pid}:" in j.worker_id]

    def stop_workers(self) -> None:
        started = [p for p in self.processes if p.pid is not None]
        for process in started:
            if process.is_alive():
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in started:
            process.join(max(deadline - time.monotonic(), 0.1))
            if process.is_alive():
                process.kill()
                process.join()

    def close(self) -> None:
        """Stop the workers, close the store, remove the folder (unless kept)."""
        self.stop_workers()
        self.app.store.close()
        if not self.config.keep:
            shutil.rmtree(self.folder, ignore_errors=True)

    # --- the script ----------------------------------------------------------------------

    def tally(self) -> tuple[int, int]:
        """(finished, total) over both queues."""
        total = finished = 0
        for queue in (self.fetch_q, self.thumb_q):
            for status, n in queue.counts().items():
                total += n
                finished += n if is_terminal(status) else 0
        return finished, total

    def step(self, finished: int, total: int) -> bool:
        """Take the script's next step if it is due; True once the run is over."""
        if not self.crash_requested:
            if finished >= self.config.kill_at * self.expected_jobs or finished == total:
                self.request_crash()
            return False
        if self.killed is None:
            self.kill_victim()
            return False
        if self.replay is None:
            self.replay_batch()
            return False  # count again before deciding we are done
        return finished == total

    def drive(self, on_tick: Callable[[int, int], None]) -> None:
        started = time.monotonic()
        while time.monotonic() - started < self.config.timeout_s:
            finished, total = self.tally()
            on_tick(finished, total)
            if self.step(finished, total):
                return
            time.sleep(POLL_S)
        self.note(f"timed out after {self.config.timeout_s:.0f} s with jobs still live")


def run_demo(config: DemoConfig | None = None, console: Console | None = None) -> dict[str, Any]:
    """Run the demo; returns the summary (see ``leaseq.demo.summary.summarize``).

    A SIGTERM ends it as ``SystemExit(143)``, so its workers are stopped and its folder
    removed as after a Ctrl-C; a second Ctrl-C or SIGTERM during that cleanup is ignored.
    """
    config = config or DemoConfig()
    console = console or Console(stderr=not config.live)
    with _terminate_as_exit():
        run = DemoRun(config, console)
        try:
            summary = _follow_script(run)
        finally:
            with _ignoring(signal.SIGINT, signal.SIGTERM):
                run.close()
    if config.live:
        print_summary(console, summary)
    return summary


def _follow_script(run: DemoRun) -> dict[str, Any]:
    started = time.monotonic()
    created = run.produce()
    run.note(f"enqueued {created['created']} fetch jobs (+{INVALID_JOBS} for a renamed task) "
             f"into {run.url if run.config.url else 'a fresh SQLite file'}")
    for _ in range(run.config.workers):
        run.start_worker()
    run.note(f"started {run.config.workers} worker processes × {run.config.concurrency} slots")
    _drive_with_progress(run)
    elapsed = time.monotonic() - started
    run.stop_workers()  # before the count: no handler may still be writing an effect
    return summarize(run, elapsed)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _exit_143(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(143)  # 128 + SIGTERM, as if the signal had ended the process


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM (``timeout``, systemd, ``kill PID``) raises ``SystemExit(143)`` meanwhile: left
    at its default it would end the process at once, skipping the cleanup."""
    if not _in_main_thread():  # only the main thread may set handlers
        yield
        return
    old = signal.signal(signal.SIGTERM, _exit_143)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def _ignoring(*signums: signal.Signals) -> Iterator[None]:
    if not _in_main_thread():
        yield
        return
    old = {signum: signal.signal(signum, signal.SIG_IGN) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def _starting_children(folder: str) -> Iterator[None]:
    """Start a worker process with SIGINT ignored, and from a current directory that exists.

    A spawned child inherits an ignored SIGINT from its first instruction: otherwise a Ctrl-C
    while it still imports (before ``_worker_main`` ignores it) prints its KeyboardInterrupt
    traceback. Spawning reads the current directory; a deleted one makes it fail, so the child
    then starts in the run's folder (only then: a relative ``--url`` is read from the
    directory the demo was started in).
    """
    try:
        os.getcwd()
        gone = None
    except FileNotFoundError:
        gone = os.open(".", getattr(os, "O_PATH", os.O_RDONLY))
        os.chdir(folder)
    try:
        with _ignoring(signal.SIGINT):
            yield
    finally:
        if gone is not None:
            os.fchdir(gone)
            os.close(gone)


def _drive_with_progress(run: DemoRun) -> None:
    if not run.config.live:
        run.drive(lambda finished, total: None)
        return
    columns = (TextColumn("[bold]jobs finished"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=run.console, transient=False) as progress:
        bar = progress.add_task("jobs", total=run.expected_jobs)
        run.drive(lambda finished, total: progress.update(bar, completed=finished, total=total))
