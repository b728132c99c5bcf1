"""A worker run with ``handle_signals=True`` in this process: a first stop signal drains it
(the running job finishes and ``run`` returns), through ``leaseq.signals``; the handlers it
replaced are put back. The second signal's exit is in test_worker_processes.py."""

from __future__ import annotations

import os
import signal
import socket
import threading

import pytest

import leaseq
from leaseq.errors import InvalidInput
from leaseq.worker import Worker, WorkerConfig


@pytest.mark.timeout(60)
def test_a_first_stop_signal_drains_the_worker_and_run_returns(app: leaseq.App) -> None:
    # Given a job whose handler sends this process SIGTERM while it runs
    @app.task(queue="work")
    def stop_me() -> str:
        os.kill(os.getpid(), signal.SIGTERM)
        return "finished"

    stop_me.enqueue(job_id="s")
    before = signal.getsignal(signal.SIGTERM)
    worker = Worker(app, WorkerConfig(concurrency=1, grace_s=30, idle_max_s=0.05))
    # A safety net only: were the signal not heeded, run would never return
    net = threading.Timer(30, worker.request_stop)
    net.start()
    try:
        # When a worker that handles signals runs (not in burst: only a stop ends it)
        worker.run(handle_signals=True)
    finally:
        net.cancel()
    # Then the signal stopped it, after the running job had finished and been saved
    assert worker._signals.received == 1 and not worker._stop.is_set()
    job = app.queue("work").get("s")
    assert job is not None and job.status == "done"
    # And the handler it replaced is back
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_handlers_go_back_when_the_metrics_port_is_taken(app: leaseq.App) -> None:
    # Given a metrics port another socket holds
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        worker = Worker(app, WorkerConfig(queues=("work",), metrics_port=port,
                                          metrics_addr="127.0.0.1"))
        # When the worker cannot serve its metrics
        with pytest.raises(InvalidInput, match="cannot serve metrics"):
            worker.run(handle_signals=True)
    # Then the signal handlers it installed were put back
    assert {s: signal.getsignal(s) for s in before} == before
