"""``leaseq demo``'s checks and its process handling.

The checks run on a small demo run in this process: three healthy images worked off by an
in-process burst worker (one attempt each, nothing waits), then counted. A fault is injected
into the store or the pipeline where a real one would be, and the command's exit status read
with the run's summary. The signal tests run the demo as a real process.
"""

from __future__ import annotations

import io
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

import leaseq.demo
from leaseq.cli import cli
from leaseq.demo import DemoConfig, DemoRun, run_demo, summarize
from leaseq.demo import tasks as demo_tasks
from leaseq.job import EnqueueOutcome
from leaseq.stores.sqlite import enqueue as sqlite_enqueue
from leaseq.worker import Worker, WorkerConfig

LEASEQ = [sys.executable, "-m", "leaseq.cli"]
HEALTHY = ["img-00000", "img-00001", "img-00002"]  # fate "ok": done on their first attempt


@pytest.fixture
def demo_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DemoRun]:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run = DemoRun(DemoConfig(jobs=20, live=False), Console(file=io.StringIO()))
    assert all(demo_tasks.fate(s) == "ok" for s in HEALTHY)
    run.sources, run.held_back = list(HEALTHY), []
    yield run
    run.stop_workers()
    run.app.store.close()


def finish(run: DemoRun, before_replay: Callable[[], Any] = lambda: None) -> dict[str, Any]:
    """Send, work every job off, replay, count."""
    work(run)
    before_replay()
    run.replay_batch()
    return summarize(run, 1.0)


def work(run: DemoRun) -> None:
    run.produce()
    Worker(run.app, WorkerConfig(concurrency=2, burst=True, idle_max_s=0.05)).run()


def exit_status(summary: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> int:
    """The exit status ``leaseq demo`` gives a run that ended with this summary."""
    monkeypatch.setattr(leaseq.demo, "run_demo", lambda config: summary)
    return CliRunner().invoke(cli, ["demo", "--json"]).exit_code


def test_a_healthy_run_passes_every_check(demo_run: DemoRun,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    summary = finish(demo_run)
    assert summary["failed_checks"] == []
    assert (summary["done"], summary["quarantined_by_reason"]) == (6, {"invalid": 3})
    assert exit_status(summary, monkeypatch) == 0


def test_a_job_the_store_never_wrote_is_lost(demo_run: DemoRun,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a store that acknowledges one fetch as created but never writes it
    upsert = sqlite_enqueue.SQLiteEnqueue._upsert

    def drop(self: Any, conn: Any, queue: str, spec: Any, old: Any, on_conflict: Any) -> Any:
        if spec.job_id == "img-00001" and old is None:
            return EnqueueOutcome.CREATED
        return upsert(self, conn, queue, spec, old, on_conflict)

    monkeypatch.setattr(sqlite_enqueue.SQLiteEnqueue, "_upsert", drop)
    # When the run ends
    summary = finish(demo_run)
    # Then the job the producer sent counts as lost, and the run fails
    assert exit_status(summary, monkeypatch) == 1
    assert summary["lost"] == 1
    assert summary["failed_checks"] == ["lost 1"]


def test_a_job_done_without_its_effect_fails_the_run(demo_run: DemoRun,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a thumbnail handler that returns without making its thumbnail
    apply = demo_tasks.Effects.apply

    def skip(self: Any, job: Any, kind: str, subject: str) -> bool:
        return True if (kind, subject) == ("thumbnail", "img-00001") else apply(
            self, job, kind, subject)

    monkeypatch.setattr(demo_tasks.Effects, "apply", skip)
    # When the run ends
    summary = finish(demo_run)
    # Then the job is done, but without its effect, and the run fails
    assert exit_status(summary, monkeypatch) == 1
    assert (summary["done"], summary["effects"]) == (6, 5)
    assert summary["failed_checks"] == ["done without effect 1"]


def test_a_replay_that_changes_a_job_fails_the_run(demo_run: DemoRun,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a store that takes the replay of a finished job as a new revision
    decide = sqlite_enqueue.decide_upsert

    def as_update(*args: Any) -> EnqueueOutcome:
        outcome = decide(*args)
        return EnqueueOutcome.UPDATED if outcome is EnqueueOutcome.UNCHANGED else outcome

    # When the producer replays its batch
    summary = finish(demo_run, before_replay=lambda: monkeypatch.setattr(
        sqlite_enqueue, "decide_upsert", as_update))
    # Then the run fails: every replayed job must come back unchanged
    assert exit_status(summary, monkeypatch) == 1
    assert summary["replay"] == {"updated": 1}
    assert "replay not all unchanged (updated 1)" in summary["failed_checks"]


def test_a_healthy_job_quarantined_fails_the_run(demo_run: DemoRun,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a worker that quarantines a healthy image (its handler takes it for corrupt)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(demo_tasks, "fate", lambda s: "corrupt" if s == "img-00001" else "ok")
        work(demo_run)
    demo_run.replay_batch()
    summary = summarize(demo_run, 1.0)
    # Then its ending is not the one its fate allows, and the run fails
    assert exit_status(summary, monkeypatch) == 1
    assert summary["quarantined_by_reason"] == {"invalid": 3, "permanent": 1}
    assert summary["unexpected"] == ["img-00001 ended failed(permanent), expected done"]
    assert summary["failed_checks"] == ["unexpected endings 1"]


def test_fates_allow_what_the_demos_own_sigkill_does() -> None:
    # A flaky_twice image needs 3 attempts; the one SIGKILL may cost it one more
    assert demo_tasks.DEMO_MAX_ATTEMPTS >= 3 + 1
    assert demo_tasks.ENDINGS["flaky_twice"] == {"done"}
    # A crashing image killed on its last attempt ends expired, not exhausted
    assert demo_tasks.ENDINGS["crashing"] == {"failed(exhausted)", "failed(expired)"}


# --- processes and signals ------------------------------------------------------------------


def test_a_worker_ignores_ctrl_c_from_its_first_instruction(demo_run: DemoRun) -> None:
    # When a worker process is started
    process = demo_run.start_worker()
    # Then SIGINT is already ignored while it still imports (no KeyboardInterrupt traceback)
    assert ignored_signals(process.pid) & (1 << (signal.SIGINT - 1))
    # And the demo itself takes Ctrl-C again
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_worker_starts_from_a_deleted_current_directory(demo_run: DemoRun, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a current directory that was removed after the shell went there
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    # When a worker is started, then it starts, and the current directory is given back
    assert demo_run.start_worker().pid is not None
    assert os.readlink("/proc/self/cwd") == f"{gone} (deleted)"


def test_a_second_ctrl_c_during_cleanup_still_removes_the_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a Ctrl-C early in the run, and a second one while it cleans up
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stop_workers = DemoRun.stop_workers

    def interrupted() -> Any:
        raise KeyboardInterrupt

    def stop_again(self: DemoRun) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        stop_workers(self)

    monkeypatch.setattr(DemoRun, "produce", lambda self: interrupted())
    monkeypatch.setattr(DemoRun, "stop_workers", stop_again)
    # When the demo is interrupted
    with pytest.raises(KeyboardInterrupt):
        run_demo(DemoConfig(jobs=20, live=False), Console(file=io.StringIO()))
    # Then its folder is gone all the same, and Ctrl-C is handled as before
    assert list(tmp_path.glob("leaseq-demo-*")) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sigterm_stops_the_workers_and_removes_the_folder(tmp_path: Path) -> None:
    # Given a demo whose workers have started
    demo, workers = start_demo(tmp_path)
    try:
        # When it gets a SIGTERM
        demo.send_signal(signal.SIGTERM)
        # Then it stops its workers, removes its folder and exits 143
        assert demo.wait(60) == 143
        assert wait_gone(workers, timeout_s=0) == []
        assert list(tmp_path.glob("leaseq-demo-*")) == []
    finally:
        kill(demo, workers)


def test_workers_stop_when_the_demo_is_killed(tmp_path: Path) -> None:
    # Given a demo whose workers have started
    demo, workers = start_demo(tmp_path)
    try:
        # When it is SIGKILLed (no cleanup of its own can run)
        demo.kill()
        demo.wait()
        # Then its workers see it gone and stop
        assert wait_gone(workers, timeout_s=60) == []
    finally:
        kill(demo, workers)


def start_demo(tmp_path: Path) -> tuple[subprocess.Popen[str], list[int]]:
    """A demo process, once it has started its workers; and their pids."""
    demo = subprocess.Popen([*LEASEQ, "demo", "--jobs", "2000"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path), "COLUMNS": "200"})
    assert demo.stdout is not None
    for line in demo.stdout:  # the demo says so after starting them
        if "started 2 worker processes" in line:
            break
    else:
        pytest.fail(f"the demo ended first: {demo.wait()}")
    # stdout stays open (its little output fits the pipe): closed, the demo's next line fails
    workers = [pid for pid in children(demo.pid) if "spawn_main" in cmdline(pid)]
    assert len(workers) == 2
    return demo, workers


def children(pid: int) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (FileNotFoundError, NotADirectoryError, ProcessLookupError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except FileNotFoundError:
        return ""


def ignored_signals(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^SigIgn:\s*([0-9a-f]+)$", status, re.M)
    assert match
    return int(match.group(1), 16)


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Wait (on pidfds, not by polling) for the processes to exit; the ones still there."""
    left = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            if not select.select([fd], [], [], timeout_s)[0]:
                left.append(pid)
        finally:
            os.close(fd)
    return left


def kill(demo: subprocess.Popen[str], workers: list[int]) -> None:
    if demo.poll() is None:
        demo.kill()
        demo.wait()
    demo.stdout.close()  # type: ignore[union-attr]
    for pid in wait_gone(workers, timeout_s=0):
        os.kill(pid, signal.SIGKILL)
