"""The FastAPI router and lifespan in process (``TestClient``): who may read a job, a
lifespan started again after a shutdown, and the embedded worker's start, failure and stop, on
SQLite and PostgreSQL (a fresh schema)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

pytest.importorskip("httpx", reason="httpx is not installed")
pytest.importorskip("fastapi", reason="leaseq[fastapi] is not installed")

from fastapi import FastAPI, Header, HTTPException
from fastapi.testclient import TestClient
from fastapi_helpers import fresh_store_url

import leaseq
from leaseq import connect, sweeper
from leaseq.contrib.fastapi import jobs_router, lifespan, new_job_id
from leaseq.errors import InvalidInput
from leaseq.worker import ABANDONED_EVENT, WorkerConfig

ALICE, BOB = {"Authorization": "alice"}, {"Authorization": "bob"}


def caller(authorization: str = Header(default="")) -> str:
    if authorization not in ("alice", "bob"):
        raise HTTPException(401)
    return authorization


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    store_url = fresh_store_url(request.param, tmp_path)
    yield store_url
    if request.param == "postgres":
        with connect(store_url) as store:
            store.drop()


@pytest.fixture
def jobs(url: str) -> leaseq.App:
    jobs = leaseq.App(url=url)

    @jobs.task(queue="reports")
    def build(n: int) -> int:
        return n

    return jobs


@pytest.fixture
def api(jobs: leaseq.App) -> FastAPI:
    api = FastAPI(lifespan=lifespan(jobs))
    api.include_router(jobs_router(jobs, tasks=["build"], principal=caller))
    return api


def test_a_job_is_readable_only_by_the_caller_that_submitted_it(api: FastAPI) -> None:
    with TestClient(api) as client:
        # Given a job alice submitted, with and without an Idempotency-Key
        plain = client.post("/jobs/build", json={"n": 1}, headers=ALICE).json()["job_id"]
        keyed = client.post("/jobs/build", json={"n": 2},
                            headers={**ALICE, "Idempotency-Key": "k"}).json()["job_id"]
        for job_id in (plain, keyed):
            # When alice and bob read it
            # Then alice sees it; bob gets the 404 of an unknown id
            assert client.get(f"/jobs/build/{job_id}", headers=ALICE).status_code == 200
            assert client.get(f"/jobs/build/{job_id}", headers=BOB).json() == (
                client.get("/jobs/build/nope", headers=BOB).json())
            assert client.get(f"/jobs/build/{job_id}", headers=BOB).status_code == 404


def test_a_job_of_the_apps_own_path_operation_is_its_callers(api: FastAPI,
                                                              jobs: leaseq.App) -> None:
    with TestClient(api) as client:
        job_id = jobs.tasks["build"].enqueue(3, job_id=new_job_id("bob")).job_id
        assert client.get(f"/jobs/build/{job_id}", headers=BOB).status_code == 200
        assert client.get(f"/jobs/build/{job_id}", headers=ALICE).status_code == 404


def test_the_lifespan_starts_again_after_a_shutdown(api: FastAPI, jobs: leaseq.App) -> None:
    # Given a lifespan that ran once and shut down
    with TestClient(api) as client:
        assert client.post("/jobs/build", json={"n": 1}, headers=ALICE).status_code == 202
    assert not jobs.has_open_store()
    # When the server starts again (a second TestClient)
    with TestClient(api) as client:
        # Then it works on a fresh store
        again = client.post("/jobs/build", json={"n": 2}, headers=ALICE)
        assert again.status_code == 202
        assert client.get(f"/jobs/build/{again.json()['job_id']}",
                          headers=ALICE).status_code == 200
    assert jobs.tasks["build"].enqueue(3).outcome == "created"  # reopened on use


def test_the_lifespan_leaves_a_store_it_did_not_open(api: FastAPI, jobs: leaseq.App) -> None:
    # Given an App whose store was open before the server started
    store = jobs.store
    with TestClient(api) as client:
        assert client.post("/jobs/build", json={"n": 1}, headers=ALICE).status_code == 202
    # Then the shutdown leaves it open, in the App's hands
    assert jobs.store is store
    assert jobs.tasks["build"].enqueue(2).outcome == "created"
    store.close()


def test_an_embedded_worker_that_cannot_start_fails_the_start_up(jobs: leaseq.App) -> None:
    # Given an embedded worker whose metrics port is taken
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = WorkerConfig(metrics_port=taken.getsockname()[1], metrics_addr="127.0.0.1")
        api = FastAPI(lifespan=lifespan(jobs, worker=config))
        # When the server starts, Then its start-up fails with the worker's reason
        with pytest.raises(InvalidInput, match="cannot serve metrics"), TestClient(api):
            pass
    # And the store it opened is closed again
    assert not jobs.has_open_store()


def test_a_failed_start_up_closes_the_store_it_opened(url: str) -> None:
    # Given an embedded worker for an App with no task yet
    jobs = leaseq.App(url=url)
    api = FastAPI(lifespan=lifespan(jobs, worker=True))
    # When the server starts, Then the worker cannot be built and the start-up fails
    with pytest.raises(InvalidInput, match="nothing to work on"), TestClient(api):
        pass
    # And the store it opened is closed, so the next start-up opens (and closes) its own
    assert not jobs.has_open_store()

    @jobs.task
    def noop() -> None:
        return None

    with TestClient(api):
        assert jobs.has_open_store()
    assert not jobs.has_open_store()


def test_an_embedded_worker_that_dies_is_logged_and_raised_at_shutdown(
        jobs: leaseq.App, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # Given an embedded worker whose first sweep fails with a bug once the app serves
    serving = threading.Event()

    def broken_sweep(*args: object, **kwargs: object) -> list[sweeper.SweepResult]:
        serving.wait(timeout=10)
        raise RuntimeError("a bug in the sweep")

    monkeypatch.setattr(sweeper, "run_once", broken_sweep)
    api = FastAPI(lifespan=lifespan(jobs, worker=True))
    # When the app has started and the worker dies
    with pytest.raises(RuntimeError, match="a bug in the sweep"), TestClient(api):
        serving.set()
    # Then its death was logged, the shutdown raised it, and the store is closed
    assert [r.levelname for r in caplog.records if getattr(r, "action", None) == "worker_error"
            ] == ["ERROR"]
    assert not jobs.has_open_store()


def test_stopping_an_idle_embedded_worker_wakes_it(jobs: leaseq.App,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Given an embedded worker idle in a long wait for work
    store = jobs.store
    idle = threading.Event()
    woken: list[bool] = []
    wait_for_work = store.wait_for_work

    def watched(queues: Sequence[str], timeout_s: float) -> bool:
        idle.set()
        woken.append(wait_for_work(queues, timeout_s))
        return woken[-1]

    monkeypatch.setattr(store, "wait_for_work", watched)
    config = WorkerConfig(idle_min_s=5, idle_max_s=5, sweep_every_s=60)
    api = FastAPI(lifespan=lifespan(jobs, worker=config))
    with TestClient(api):
        assert idle.wait(timeout=5)
    # When the server stops, Then the stop woke the wait instead of letting it run out
    assert woken == [True]
    store.close()


def test_a_handler_outliving_the_grace_period_is_warned_about(
        jobs: leaseq.App, caplog: pytest.LogCaptureFixture) -> None:
    # Given an embedded worker with no grace period, running a sync handler that hangs
    running, release = threading.Event(), threading.Event()

    @jobs.task(queue="slow")
    def hang() -> None:
        running.set()
        release.wait(timeout=10)

    api = FastAPI(lifespan=lifespan(jobs, worker=WorkerConfig(grace_s=0)))
    try:
        with TestClient(api):
            hang.enqueue()
            assert running.wait(timeout=5)
        # When the server stops, Then it warns that the handler's thread still runs
        (warning,) = [r for r in caplog.records if getattr(r, "action", None) == "grace_expired"]
        assert warning.levelno == logging.WARNING
        assert "1 sync handler(s) still running" in warning.getMessage()
    finally:
        release.set()


def test_the_straggler_warning_counts_every_handler_still_running_and_says_what_exit_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # Given an embedded worker (no grace period, a 1.5 s lease) running a sync handler deaf
    # to its lease, and a store whose heartbeats can be cut off
    jobs = leaseq.App(url=f"sqlite:///{tmp_path / 'jobs.db'}",
                      queues={"slow": {"lease_s": 1.5, "heartbeat_every_s": 0.3}})
    started = {"first": threading.Event(), "second": threading.Event()}
    release = threading.Event()

    @jobs.task(queue="slow")
    def deaf(name: str) -> None:
        started[name].set()
        release.wait(timeout=30)

    store = jobs.store
    cut = threading.Event()
    heartbeat_many = store.heartbeat_many

    def cut_off(*args: object, **kwargs: object) -> object:
        if cut.is_set():
            raise leaseq.StoreUnavailable("network unreachable")
        return heartbeat_many(*args, **kwargs)

    monkeypatch.setattr(store, "heartbeat_many", cut_off)
    config = WorkerConfig(concurrency=2, grace_s=0, lease_margin_s=0.5)
    api = FastAPI(lifespan=lifespan(jobs, worker=config))
    q = jobs.queue("slow")
    try:
        with TestClient(api):
            # the first handler's lease clock runs out: it is abandoned, and runs on
            deaf.enqueue("first", job_id="first")
            assert started["first"].wait(timeout=5)
            cut.set()
            deadline = time.monotonic() + 10
            while not any(e.event == ABANDONED_EVENT for e in q.journal("first")):
                assert time.monotonic() < deadline, "the first job was never abandoned"
                release.wait(0.05)
            cut.clear()
            # the second one is still running when the server stops
            deaf.enqueue("second", job_id="second")
            assert started["second"].wait(timeout=5)
        # When the server has stopped
        (warning,) = [r for r in caplog.records if getattr(r, "action", None) == "grace_expired"]
        text = warning.getMessage()
        # Then the warning counts both handlers (the abandoned one had left the jobs in
        # flight), and says the jobs run again and what the exit does with their threads
        assert "2 sync handler(s) still running" in text
        assert "will run again" in text
        assert "SIGTERM" in text and "cut off" in text
        assert "SIGINT" in text and "holds up the exit" in text
        assert "exits only once it returns" not in text
    finally:
        release.set()
        store.close()
