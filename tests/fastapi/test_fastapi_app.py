"""The FastAPI router and lifespan in process (``TestClient``): who may read a job, and a
lifespan started again after a shutdown, on SQLite and PostgreSQL (a fresh schema)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("httpx", reason="httpx is not installed")
pytest.importorskip("fastapi", reason="leaseq[fastapi] is not installed")

from fastapi import FastAPI, Header, HTTPException
from fastapi.testclient import TestClient
from fastapi_helpers import fresh_store_url

import leaseq
from leaseq import connect
from leaseq.contrib.fastapi import jobs_router, lifespan, new_job_id

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
