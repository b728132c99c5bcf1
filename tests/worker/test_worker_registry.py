"""The worker registry: a running worker is listed with its queues, a stopped one is not, a
killed one (no more beats) is pruned by the sweeper."""

from __future__ import annotations

import threading
import time

import leaseq
from leaseq import sweeper
from leaseq.worker import Worker, WorkerConfig


def test_a_running_worker_is_registered_and_a_stopped_one_forgotten(app: leaseq.App) -> None:
    # Given a worker serving one queue
    @app.task(queue="work")
    def noop() -> None:
        return None

    worker = Worker(app, WorkerConfig(queues=("work",)), worker_id="host:1:abcd0001")
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, kwargs={"stop_event": stop})
    thread.start()
    try:
        # When it runs, Then the registry lists it with its queues (its first beat is at start)
        deadline = time.monotonic() + 10
        while not app.store.list_workers() and time.monotonic() < deadline:
            time.sleep(0.01)
        (info,) = app.store.list_workers()
        assert (info.worker_id, info.queues, info.in_flight) == ("host:1:abcd0001", ["work"], 0)
    finally:
        stop.set()
        thread.join(timeout=30)
    # And after a clean stop it is gone
    assert app.store.list_workers() == []


def test_the_sweeper_prunes_a_worker_that_stopped_beating(app: leaseq.App) -> None:
    # Given a worker that beat once and was killed
    app.store.register_worker("host:2:dead0002", ["work"], 1)
    # When a sweep runs long after its last beat
    app.store.time_offset_s = 301
    sweeper.run_once(app.store)
    # Then it is forgotten; a sweep right after a beat keeps a live one
    assert app.store.list_workers() == []
    app.store.register_worker("host:3:live0003", ["work"], 0)
    sweeper.run_once(app.store)
    assert [w.worker_id for w in app.store.list_workers()] == ["host:3:live0003"]


def test_the_registry_beat_is_paced_and_its_failure_never_stops_the_heartbeat() -> None:
    from leaseq.errors import StoreUnavailable
    from leaseq.heartbeat import Heartbeat

    # Given a heartbeat whose registry hook fails every time, on an injected clock
    now = [0.0]
    calls: list[float] = []

    def on_tick() -> None:
        calls.append(now[0])
        raise StoreUnavailable("database away")

    beat = Heartbeat(lambda: [], lambda item: None, clock=lambda: now[0], on_tick=on_tick,
                     tick_every_s=10.0)
    # When its loop comes round at 0 s, 5 s and 10 s
    for at in (0.0, 5.0, 10.0):
        now[0] = at
        beat._tick()  # raises nothing: the leases' beat goes on
    # Then the hook ran at once and then every 10 s only
    assert calls == [0.0, 10.0]
