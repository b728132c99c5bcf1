"""Real worker processes and real signals: SIGKILL, SIGTERM, a second signal, --processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from worker_helpers import events, running, wait_until

import leaseq
from leaseq.signals import EXIT_SECOND_SIGNAL
from leaseq.supervisor import SAME_STOP_S

HERE = Path(__file__).parent


@pytest.fixture
def proc_app(url: str) -> Iterator[leaseq.App]:
    """The worker_tasks app (as the subprocesses load it) on this test's database."""
    sys.path.insert(0, str(HERE))
    try:
        app = leaseq.App.from_ref("worker_tasks:app")
    finally:
        sys.path.remove(str(HERE))
    app.use_store(leaseq.connect(url))
    yield app
    app.store.close()


@contextmanager
def worker_process(url: str, *args: str, new_session: bool = False
                   ) -> Iterator[subprocess.Popen]:
    """``leaseq worker`` of worker_tasks; ``new_session``: in a process group of its own
    (its id is the process's), as a service manager starts it."""
    env = {**os.environ, "PYTHONPATH": str(HERE), "LEASEQ_URL": url}
    command = [sys.executable, "-m", "leaseq.cli", "worker", "worker_tasks:app",
               "--sweep-every-s", "0.2", *args]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True,
                               start_new_session=new_session)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
        if process.stdout:
            process.stdout.close()


def started(marker: Path, attempt: int = 1) -> bool:
    return Path(f"{marker}.{attempt}").exists()


def test_sigkill_mid_job_is_reclaimed_and_done_on_attempt_2(
    proc_app: leaseq.App, url: str, tmp_path: Path
) -> None:
    # Given a worker process in the middle of a job that would block for a minute
    marker = tmp_path / "m"
    proc_app.tasks["hang_first"].enqueue(marker=str(marker), seconds=60, job_id="k")
    with worker_process(url) as process:
        wait_until(lambda: started(marker), what="attempt 1 to start")
        # When the process is killed outright
        process.send_signal(signal.SIGKILL)
        assert process.wait(10) == -signal.SIGKILL
    # Then another worker takes the job once its lease has run out, and finishes it
    q = proc_app.queue("work")
    assert q.get("k").status == "processing"  # type: ignore[union-attr]
    with running(proc_app, sweep_every_s=0.2, idle_max_s=0.1):
        wait_until(lambda: q.is_finished("k"), what="the job to be done")
    job = q.get("k")
    assert job is not None and (job.status, job.attempts) == ("done", 2)
    assert job.result["attempt"] == 2 and job.result["pid"] == os.getpid()
    story = q.journal("k")
    claims = [e for e in story if e.event == "claimed"]
    assert len(claims) == 2 and claims[0].worker_id != claims[1].worker_id
    assert claims[1].reason == "redelivered"


def test_sigterm_lets_the_in_flight_job_finish(
    proc_app: leaseq.App, url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "m"
    proc_app.tasks["hang_first"].enqueue(marker=str(marker), seconds=0.5, job_id="t")
    with worker_process(url, "--grace-s", "20") as process:
        wait_until(lambda: started(marker))
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    job = proc_app.queue("work").get("t")
    assert job is not None and (job.status, job.attempts) == ("done", 1)


def test_sigterm_gives_back_what_does_not_finish_within_the_grace_period(
    proc_app: leaseq.App, url: str, tmp_path: Path
) -> None:
    # Given a worker process holding a job that will not end soon
    marker = tmp_path / "m"
    proc_app.tasks["hang_first"].enqueue(marker=str(marker), seconds=60, job_id="g")
    with worker_process(url, "--grace-s", "0.5") as process:
        wait_until(lambda: started(marker))
        # When it is asked to stop
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        output = process.stdout.read()  # type: ignore[union-attr]
    # Then the job is ready again at once, its attempt given back (counted: the handler ran),
    # and it says why
    q = proc_app.queue("work")
    job = q.get("g")
    assert job is not None and (job.status, job.attempts, job.givebacks) == ("pending", 0, 1)
    assert q.ready() == 1
    assert events(q, "g")[-1] == "given_back"
    assert "given back" in output


def test_a_second_signal_exits_at_once(proc_app: leaseq.App, url: str, tmp_path: Path) -> None:
    marker = tmp_path / "m"
    proc_app.tasks["hang_first"].enqueue(marker=str(marker), seconds=60, job_id="x")
    with worker_process(url, "--grace-s", "60") as process:
        wait_until(lambda: started(marker))
        process.send_signal(signal.SIGTERM)
        process.send_signal(signal.SIGINT)
        assert process.wait(20) == 130
    # The job is left to its lease (nothing was written on the way out)
    assert proc_app.queue("work").get("x").status == "processing"  # type: ignore[union-attr]


def test_processes_in_burst_mode_finish_everything_and_exit_0(
    proc_app: leaseq.App, url: str
) -> None:
    quick = proc_app.tasks["quick"]
    proc_app.enqueue_many(quick.spec(n=n, job_id=f"q{n}") for n in range(40))
    with worker_process(url, "--processes", "2", "--burst", "--concurrency", "2") as process:
        assert process.wait(60) == 0
    assert proc_app.queue("work").counts() == {"done": 40}


def test_supervisor_exits_non_zero_when_a_child_crashes(proc_app: leaseq.App, url: str) -> None:
    proc_app.tasks["crash"].enqueue(code=3, job_id="boom")
    with worker_process(url, "--processes", "2") as process:
        assert process.wait(60) == 1
        output = process.stdout.read()  # type: ignore[union-attr]
    assert "exited with status 3" in output


def test_a_child_stopped_on_its_own_stops_the_others_and_the_supervisor_exits_1(
    proc_app: leaseq.App, url: str
) -> None:
    # Given two supervised worker processes, both serving (in the registry)
    with worker_process(url, "--processes", "2") as process:
        lines, reader = _lines_of(process)
        wait_until(lambda: len(proc_app.store.list_workers()) == 2)
        children = _children_of(process.pid)
        assert len(children) == 2, children
        # When one of them alone is stopped (a SIGTERM to its pid): it drains and exits 0
        os.kill(children[0], signal.SIGTERM)
        # Then the supervisor does not serve on at half strength, unseen: it says so, stops
        # the other, and exits 1
        assert process.wait(30) == 1
        reader.join(10)
    assert any("though no stop was asked of the workers" in line for line in lines), lines


def _children_of(pid: int) -> list[int]:
    """The worker processes a supervisor started (multiprocessing's spawned children)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"spawn_main" in command:
            found.append(int(stat.parent.name))
    return sorted(found)


def test_a_second_stop_to_the_supervisor_exits_130_and_is_not_reported_as_a_crash(
    proc_app: leaseq.App, url: str, tmp_path: Path
) -> None:
    # Given a supervised child draining a job that will not finish within its grace period
    marker = tmp_path / "m"
    proc_app.tasks["hang_first"].enqueue(marker=str(marker), seconds=60, job_id="s")
    with worker_process(url, "--processes", "2", "--grace-s", "60") as process:
        wait_until(lambda: started(marker))
        lines, reader = _lines_of(process)
        process.send_signal(signal.SIGTERM)
        wait_until(lambda: any("stopping: 1 job(s) in flight" in line for line in lines))
        # When a second stop comes after the child's window for the same stop has passed
        time.sleep(SAME_STOP_S + 0.5)
        process.send_signal(signal.SIGTERM)
        # Then the supervisor exits as one worker process would, naming no crash
        assert process.wait(20) == EXIT_SECOND_SIGNAL
        reader.join(10)
    assert any("exited at once on a second stop signal" in line for line in lines), lines
    assert not any("exited with status" in line for line in lines), lines
    assert proc_app.queue("work").get("s").status == "processing"  # type: ignore[union-attr]


def _lines_of(process: subprocess.Popen) -> tuple[list[str], threading.Thread]:
    """The process's output lines as they come, appended by the returned thread (it ends when
    the output does)."""
    lines: list[str] = []

    def read() -> None:
        for line in process.stdout:  # type: ignore[union-attr]
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, reader


def test_supervisor_forwards_sigterm_to_its_children(
    proc_app: leaseq.App, url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "m"
    proc_app.tasks["hang_first"].enqueue(marker=str(marker), seconds=60, job_id="f")
    with worker_process(url, "--processes", "2", "--grace-s", "0.3") as process:
        wait_until(lambda: started(marker))
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    job = proc_app.queue("work").get("f")
    assert job is not None and (job.status, job.attempts) == ("pending", 0)


def test_a_stop_sent_to_the_whole_process_group_still_lets_jobs_finish(
    proc_app: leaseq.App, url: str, tmp_path: Path
) -> None:
    # Given two supervised worker processes of one slot, each in the middle of a job that
    # needs a moment
    marker = tmp_path / "m"
    for n in range(2):
        proc_app.tasks["hang_first"].enqueue(marker=f"{marker}{n}", seconds=1.0, job_id=f"pg{n}")
    with worker_process(url, "--processes", "2", "--concurrency", "1", "--grace-s", "30",
                        new_session=True) as process:
        wait_until(lambda: all(started(Path(f"{marker}{n}")) for n in range(2)))
        # When the stop goes to every process of the group at once (systemd's default
        # KillMode, `kill -TERM -PGID`), so each child also gets the one its parent forwards
        os.killpg(process.pid, signal.SIGTERM)
        # Then that is one stop: the jobs finish within the grace period, and all exit 0
        assert process.wait(30) == 0, process.stdout.read()  # type: ignore[union-attr]
    q = proc_app.queue("work")
    assert [(q.get(f"pg{n}").status, q.get(f"pg{n}").attempts)  # type: ignore[union-attr]
            for n in range(2)] == [("done", 1)] * 2


def test_worker_runs_in_a_thread_without_signals(proc_app: leaseq.App) -> None:
    # The library API: a stop event instead of a signal.
    from leaseq.worker import Worker, WorkerConfig

    proc_app.tasks["quick"].enqueue(n=1, job_id="one")
    stop = threading.Event()
    worker = Worker(proc_app, WorkerConfig(idle_max_s=0.05))
    thread = threading.Thread(target=worker.run, kwargs={"stop_event": stop})
    thread.start()
    wait_until(lambda: proc_app.queue("work").is_finished("one"))
    stop.set()
    thread.join(10)
    assert not thread.is_alive()
