"""The benchmark harness still runs end to end (tiny N, SQLite only, a few seconds).

Not a performance test: it only checks that every leaseq scenario produces a number and the
JSON is written, so ``python -m bench`` does not rot between benchmark runs.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def importable_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(ROOT)
    monkeypatch.chdir(ROOT)


def test_quick_harness_runs_on_sqlite(tmp_path) -> None:
    # Given a tiny plan on a fresh SQLite folder
    from bench.__main__ import main

    out = tmp_path / "bench.json"
    # When the harness runs every leaseq scenario
    code = main(["--tiny", "--store", f"sqlite:///{tmp_path}/bench.db", "--json-out", str(out)])
    # Then each scenario has a positive figure and nothing failed
    data = json.loads(out.read_text())
    assert code == 0, data["errors"]
    scenarios = {r["scenario"]: r for r in data["results"]}
    assert any(s.startswith("enqueue, one") for s in scenarios)
    assert any(s.startswith("drain") for s in scenarios)
    assert "pickup latency p50" in scenarios
    assert all(r["median"] > 0 for r in data["results"])
    assert data["machine"]["python"] == ".".join(map(str, sys.version_info[:3]))
    # And the fresh database files are gone
    assert not [p for p in os.listdir(tmp_path) if p.startswith("bench_")]


def test_random_ids_are_unique_and_in_no_order() -> None:
    from bench.adapters.leaseq import job_id

    ids = [job_id(i, "random") for i in range(100_000)]
    assert len(set(ids)) == len(ids)
    assert sorted(ids) != ids
    assert [job_id(i) for i in range(3)] == ["j0", "j1", "j2"]


def test_the_harness_drains_with_random_ids(tmp_path) -> None:
    from bench.__main__ import main

    out = tmp_path / "bench.json"
    code = main(["--tiny", "--store", f"sqlite:///{tmp_path}/bench.db", "--json-out", str(out),
                 "--scenario", "drain", "--ids", "random"])
    data = json.loads(out.read_text())
    assert code == 0, data["errors"]
    assert data["machine"]["leaseq_ids"] == "random"
    assert data["results"] and all(r["median"] > 0 for r in data["results"])


def test_a_drain_whose_workers_all_exited_short_of_its_goal_fails_at_once() -> None:
    # Given a library whose burst worker exits at once, having finished nothing
    import time

    from bench.scenarios import Plan, drain
    from bench.systems import System, WorkerSpec

    class GivesUp(System):
        name = "gives-up"

        def open(self) -> None: ...

        def close(self) -> None: ...

        def enqueue_each(self, first: int, count: int) -> None: ...

        def enqueue_bulk(self, first: int, count: int, batch: int) -> None: ...

        def done_count(self) -> int:
            return 0

        def worker_argv(self, spec: WorkerSpec) -> list[str]:
            return [sys.executable, "-c", "pass"]

    # When a drain of 10 jobs runs (its timeout: 60 s)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="every worker exited with 0 of 10 jobs done"):
        drain(GivesUp(None), goal=10, processes=1, plan=Plan.tiny())  # type: ignore[arg-type]  # opens nothing
    # Then it fails as soon as the worker has gone, not at its timeout
    assert time.monotonic() - started < 30


def test_keyed_round_runs_on_sqlite(tmp_path, capsys) -> None:
    # Given a fresh SQLite folder
    from bench.keyed_round import LOOPS, main

    # When two rounds of each loop run
    code = main(["--store", f"sqlite:///{tmp_path}/round.db", "--rounds", "2", "--repeats", "1"])
    # Then every loop printed its row
    out = capsys.readouterr().out
    assert code == 0
    assert all(label.split(",")[0] in out for label, _ in LOOPS), out


def test_keyed_round_runs_its_key_loop_in_lanes_on_sqlite(tmp_path, capsys) -> None:
    # Given a fresh SQLite folder
    from bench.keyed_round import main

    # When the 10-key loop also runs in 2 and 4 lanes at once
    code = main(["--store", f"sqlite:///{tmp_path}/lanes.db", "--rounds", "2", "--repeats", "1",
                 "--lanes", "2", "--lanes", "4"])
    # Then each lane split printed its row (every lane's claim was whole, or it would raise)
    out = capsys.readouterr().out
    assert code == 0
    assert "2 lanes of 20" in out and "4 lanes of 10" in out, out


def test_a_failed_lane_is_reported_by_its_own_error_not_the_barrier_it_broke() -> None:
    # Given one lane that failed and one that met the barrier the failure broke
    import threading
    from concurrent.futures import Future

    from bench.keyed_round import _gather

    failed: Future = Future()
    failed.set_exception(RuntimeError("claimed 3 of 20 jobs in round 7"))
    broken: Future = Future()
    broken.set_exception(threading.BrokenBarrierError())
    # When their times are gathered (the broken one first)
    # Then the lane's own error is raised
    with pytest.raises(RuntimeError, match="claimed 3 of 20"):
        _gather([broken, failed])


def test_worker_round_splits_the_real_workers_rounds_on_sqlite(tmp_path, capsys) -> None:
    # Given a fresh SQLite folder
    from bench.worker_round import PARTS, main

    # When the worker drains 400 jobs over 10 keys once
    code = main(["--store", f"sqlite:///{tmp_path}/worker.db", "--jobs", "400",
                 "--repeats", "1"])
    # Then every part of the round has its row
    out = capsys.readouterr().out
    assert code == 0
    assert all(part in out for part in PARTS), out


def test_worker_round_counts_only_a_claim_one_write_and_the_next_claim() -> None:
    # Given a claim, its write, a second write, then a claim, its write and the next claim
    from bench.worker_round import Call, _lockstep_rounds

    calls = [Call("claim", 0.0, 1.0), Call("write", 3.0, 4.0), Call("write", 4.5, 5.0),
             Call("claim", 6.0, 7.0), Call("write", 9.0, 10.0), Call("claim", 10.5, 11.0)]
    starts = [1.5, 2.0, 7.25, 8.0, 11.5]
    # When they are split into rounds
    rounds = _lockstep_rounds(calls, starts)
    # Then only the second claim made one: claim 1, to first start 0.25, run 1.75, write 1,
    # to next claim 0.5
    assert rounds == [(1.0, 0.25, 1.75, 1.0, 0.5)]
