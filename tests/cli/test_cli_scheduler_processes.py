"""``leaseq scheduler`` and ``leaseq worker [--no-scheduler]`` as real processes, ticking an
every-second schedule into a SQLite file, stopped by SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from cli_periodic import app as periodic_app

import leaseq
from leaseq.ledger import ScheduleEvent, schedule_journal_id
from leaseq.testing.harness import wait_until

HERE = Path(__file__).parent
#: The leaseq under test, which the processes must import (not whichever one is installed).
SRC = Path(leaseq.__file__).resolve().parents[1]
#: A stopped scheduler or worker exits within this; its longest sleep is 60 s (max_sleep_s).
PROMPT_EXIT_S = 10.0


@contextmanager
def leaseq_process(url: str, log: Path, *args: str) -> Iterator[subprocess.Popen]:
    """``leaseq ARGS`` on ``url``, its output in ``log`` (a pipe nobody reads could fill)."""
    env = {**os.environ, "LEASEQ_URL": url,
           "PYTHONPATH": os.pathsep.join([str(HERE), str(SRC)])}
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "leaseq.cli", *args], env=env,
                                   stdout=out, stderr=subprocess.STDOUT)
        try:
            yield process
        finally:
            if process.poll() is None:
                process.kill()
            process.wait(30)


def stop(process: subprocess.Popen, log: Path) -> None:
    """SIGTERM; asserts the process exits 0 within ``PROMPT_EXIT_S``."""
    process.send_signal(signal.SIGTERM)
    try:
        status = process.wait(PROMPT_EXIT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running {PROMPT_EXIT_S:g} s after SIGTERM:\n"
                             f"{log.read_text()[-3000:]}") from None
    assert status == 0, f"exit status {status}:\n{log.read_text()[-3000:]}"


def test_the_scheduler_alone_enqueues_each_tick_once_and_exits_0_on_sigterm(
    url: str, store: leaseq.Store, tmp_path: Path
) -> None:
    # Given `leaseq scheduler` running an every-second schedule against a SQLite file
    log = tmp_path / "scheduler.log"
    with leaseq_process(url, log, "scheduler", "cli_periodic:app") as process:
        # When it has enqueued three ticks
        wait_until(lambda: len(store.list_jobs("beats")) >= 3, "three ticks enqueued")
        # Then SIGTERM stops it at once, with status 0
        stop(process, log)
    # And each tick since the registration is one job, named by its tick, with no gap
    schedule = periodic_app.schedules["beat"]
    jobs = store.list_jobs("beats", limit=1000)  # ordered by id: by tick
    ticks = [datetime.fromisoformat(j.payload["tick"]) for j in jobs]
    (registered,) = [e for e in store.journal("beats", schedule_journal_id("beat"))
                     if e.event == ScheduleEvent.REGISTERED]
    # (journaled by a statement of its own, after the cursor it set: a few ms later, more
    # under load, and a second may turn in between; hence the tolerance on both sides)
    assert registered.at - timedelta(seconds=0.1) < ticks[0] <= registered.at + timedelta(
        seconds=1.05)
    assert ticks == [ticks[0] + timedelta(seconds=n) for n in range(len(jobs))]
    assert [j.id for j in jobs] == [schedule.job_id(t) for t in ticks]
    assert all(j.task == "beat" and j.status == "pending" for j in jobs)  # no worker ran
    # And the ledger advanced to the last of them
    state = store.schedule_state("beat")
    assert state is not None
    assert (state.last_tick, state.last_job_id) == (ticks[-1], jobs[-1].id)
    assert state.cursor == ticks[-1] and state.version >= 1
    assert not state.paused and state.active


def test_sigterm_ends_the_schedulers_long_sleep_between_ticks(
    url: str, store: leaseq.Store, tmp_path: Path
) -> None:
    # Given `leaseq scheduler` with an hourly schedule, asleep once it has registered it
    log = tmp_path / "scheduler.log"
    with leaseq_process(url, log, "scheduler", "cli_periodic:hourly") as process:
        wait_until(lambda: store.schedule_state("on_the_hour"), "the schedule registered")
        # When it is asked to stop; Then it exits 0 without waiting for the next look
        stop(process, log)
    assert store.list_jobs("hours") == []  # the next hour had not come


def test_a_worker_with_no_scheduler_enqueues_no_tick_while_a_worker_without_it_does(
    tmp_path: Path
) -> None:
    # Given the every-second schedule's app, each worker on its own database
    quiet_url, ticking_url = (f"sqlite:///{tmp_path / name}.db" for name in ("quiet", "ticking"))
    quiet_log, ticking_log = tmp_path / "quiet.log", tmp_path / "ticking.log"
    with leaseq.connect(quiet_url) as quiet, leaseq.connect(ticking_url) as ticking, \
            leaseq_process(quiet_url, quiet_log, "worker", "cli_periodic:app",
                           "--no-scheduler") as quiet_worker:
        # When the worker started with --no-scheduler has been seen working
        quiet.queue("beats").enqueue("up", {}, task="ping")
        wait_until(lambda: quiet.queue("beats").is_finished("up"), "the ping job done")
        # And, while it keeps running, a worker without the flag enqueues and runs a tick
        with leaseq_process(ticking_url, ticking_log, "worker",
                            "cli_periodic:app") as ticking_worker:
            state = wait_until(lambda: _ran_a_tick(ticking), "a tick enqueued and done")
            stop(ticking_worker, ticking_log)
        stop(quiet_worker, quiet_log)
        # Then the first left the ledger alone: no schedule registered, no tick enqueued
        assert quiet.schedules() == []
        assert [j.id for j in quiet.list_jobs("beats")] == ["up"]
        # And the second's ticks are in its ledger
        assert state.last_job_id == periodic_app.schedules["beat"].job_id(state.last_tick)


def _ran_a_tick(store: leaseq.Store) -> Any:
    state = store.schedule_state("beat")
    if state is None or state.last_job_id is None:
        return None
    job = store.get("beats", state.last_job_id)
    return state if job is not None and job.status == "done" else None
