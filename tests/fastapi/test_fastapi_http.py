"""The FastAPI router and lifespan through a real server: the example app
(examples/fastapi_app) under uvicorn on a loopback port, called with httpx, its jobs run by a
real worker process (or by the worker embedded in the server)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="httpx is not installed")
pytest.importorskip("fastapi", reason="leaseq[fastapi] is not installed")
pytest.importorskip("uvicorn", reason="leaseq[fastapi] is not installed")

from fastapi_helpers import fresh_store_url  # noqa: E402

from leaseq import Queue, connect  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_app"
ALICE = {"Authorization": "Bearer secret-token-alice"}
BOB = {"Authorization": "Bearer secret-token-bob"}
BODY = {"customer_id": 42, "month": "2026-03"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(args: list[str], url: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", *args], cwd=EXAMPLE, text=True,
                            env={**os.environ, "LEASEQ_URL": url, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _stop(process: subprocess.Popen[str], timeout_s: float = 20) -> str:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=timeout_s)
    return out


class Server:
    def __init__(self, url: str, **env: str):
        self.port = _free_port()
        self.process = _start(["uvicorn", "main:api", "--host", "127.0.0.1", "--port",
                               str(self.port)], url, **env)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client.get("/docs")
                return
            except httpx.TransportError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"server did not start: {_stop(self.process)}") from None
                time.sleep(0.1)

    def post(self, body: object, headers: dict[str, str], task: str = "build_report"
             ) -> httpx.Response:
        return self.client.post(f"/jobs/{task}", json=body, headers=headers)

    def close(self) -> str:
        self.client.close()
        return _stop(self.process)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'jobs.db'}"


@pytest.fixture
def server(url: str) -> Iterator[Server]:
    running = Server(url)
    yield running
    running.close()


@pytest.fixture(params=["sqlite", "postgres"])
def any_store_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    """The server on SQLite, and on PostgreSQL (a fresh schema) when the server answers."""
    store_url = fresh_store_url(request.param, tmp_path)
    running = Server(store_url)
    yield running
    running.close()
    if request.param == "postgres":
        with connect(store_url) as store:
            store.drop()


def test_accepted_replayed_conflicting_and_invalid_requests(any_store_server: Server) -> None:
    server = any_store_server
    first = server.post(BODY, {**ALICE, "Idempotency-Key": "march-42"})
    assert first.status_code == 202
    job_id = first.json()["job_id"]
    # a replay finds the same job; another caller's same key is another job
    assert server.post(BODY, {**ALICE, "Idempotency-Key": "march-42"}).json() == {"job_id": job_id}
    assert server.post(BODY, {**BOB, "Idempotency-Key": "march-42"}).json()["job_id"] != job_id
    # the same key with another body
    other = server.post({**BODY, "pages": 3}, {**ALICE, "Idempotency-Key": "march-42"})
    assert other.status_code == 409
    # bodies checked against build_report(customer_id: int, month: str, pages: int = 1)
    bad = server.post({"customer_id": "42", "colour": "red"}, ALICE)
    assert bad.status_code == 422
    assert "unknown argument(s) colour" in bad.json()["detail"]
    assert "missing argument(s) month" in bad.json()["detail"]
    assert server.post([1, 2], ALICE).status_code == 422
    # only the tasks given to the router, only for authenticated callers
    assert server.post(BODY, ALICE, task="send_everything").status_code == 404
    assert server.post(BODY, {}).status_code == 401
    assert server.client.get(f"/jobs/build_report/{job_id}").status_code == 401
    assert server.client.get("/jobs/build_report/nope", headers=ALICE).status_code == 404


def test_status_is_polled_until_a_worker_process_finishes_the_job(server: Server,
                                                                   url: str) -> None:
    job_id = server.post(BODY, {**ALICE, "Idempotency-Key": "k1"}).json()["job_id"]
    pending = server.client.get(f"/jobs/build_report/{job_id}", headers=ALICE).json()
    assert pending["status"] == "pending" and pending["attempts"] == 0
    worker = _start(["leaseq.cli", "worker", "jobs:app", "--url", url], url)
    try:
        deadline = time.monotonic() + 30
        while (status := server.client.get(f"/jobs/build_report/{job_id}",
                                           headers=ALICE).json())["status"] != "done":
            assert time.monotonic() < deadline, status
            time.sleep(0.1)
    finally:
        _stop(worker)
    assert status["attempts"] == 1
    assert status["result"] == {"customer_id": 42, "month": "2026-03", "pages": 1}
    assert [e["event"] for e in status["journal"]] == ["enqueued", "claimed", "result_saved"]


def test_the_embedded_worker_runs_jobs_and_stops_with_the_app(url: str) -> None:
    server = Server(url, EMBEDDED_WORKER="1")
    try:
        made = server.client.post("/reports", params={"customer_id": 7, "month": "2026-04"},
                                  headers=ALICE)
        assert made.status_code == 202
        job_id = made.json()["job_id"]
        deadline = time.monotonic() + 30
        while server.client.get(f"/jobs/build_report/{job_id}",
                                headers=ALICE).json()["status"] != "done":
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        started = time.monotonic()
        log = server.close()
    # uvicorn re-raises the SIGTERM it handled once the app has shut down
    assert server.process.returncode in (0, -signal.SIGTERM), log
    assert time.monotonic() - started < 15
    assert "Application shutdown complete" in log and "Finished server process" in log
    with connect(url) as store:
        assert Queue(store, "reports").in_flight() == 0
