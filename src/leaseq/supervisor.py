"""``leaseq worker --processes P``: P worker processes (spawn) under one supervising parent.

The parent forwards SIGTERM / SIGINT to its children as SIGTERM (children ignore SIGINT, so a
Ctrl-C in a terminal reaches each of them once, through the parent) and exits 1 if a child
crashed, 130 if a second stop signal ended the children at once (as one worker process does).
After a crash it stops the other children too: the orchestrator that started the parent is the
one to restart it, and a half-strength worker would hide the crash. A child
takes a second stop signal within ``SAME_STOP_S`` of its first for the same stop: a stop sent
to the whole process group reaches it directly and through the parent.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import warnings
from dataclasses import replace
from multiprocessing.connection import wait
from typing import Any

from leaseq.app import App
from leaseq.signals import EXIT_SECOND_SIGNAL, StopSignals
from leaseq.stores import connect
from leaseq.worker import Worker, WorkerConfig

log = logging.getLogger(__name__)

#: How soon after a supervised child's first stop signal another is the same stop, sent to the
#: process group and forwarded by the parent (``leaseq.signals.DrainThenExit``); a later one
#: ends the child at once.
SAME_STOP_S = 2.0


def load_app(ref: str) -> App:
    """Deprecated: use ``App.from_ref(ref)``."""
    warnings.warn("leaseq.supervisor.load_app is deprecated; use leaseq.App.from_ref",
                  DeprecationWarning, stacklevel=2)
    return App.from_ref(ref)


def run_worker(app_ref: str, url: str | None, config: WorkerConfig, *,
               ignore_sigint: bool = False) -> int:
    """Run one worker in this process until stopped; returns the exit status."""
    app = App.from_ref(app_ref)
    if url:
        app.use_store(connect(url))
    if ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker = Worker(app, config)
    worker.run(handle_signals=True, same_stop_s=SAME_STOP_S if ignore_sigint else 0.0)
    exit_now_if_stragglers(worker)
    return 0


def exit_now_if_stragglers(worker: Worker) -> None:
    """End the process at once (status 0) when a handler thread outlived the grace period:
    its job was given back, and a normal exit would wait for the thread, letting the handler
    carry on with its side effects while another worker may already run the job."""
    if worker.has_stragglers():
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _child(app_ref: str, url: str | None, config: WorkerConfig, log_level: int) -> None:
    logging.basicConfig(level=log_level, format="%(asctime)s %(processName)s %(levelname)s "
                                                "%(name)s: %(message)s")
    sys.exit(run_worker(app_ref, url, config, ignore_sigint=True))


def run_processes(app_ref: str, url: str | None, config: WorkerConfig, processes: int,
                  log_level: int = logging.INFO) -> int:
    """Start ``processes`` workers and supervise them; 0 when all ended cleanly, 1 when one
    crashed, ``EXIT_SECOND_SIGNAL`` (130) when a second stop signal ended them at once."""
    App.from_ref(app_ref)  # fail here, once, rather than in every child
    ctx = multiprocessing.get_context("spawn")
    children = []
    for index in range(processes):
        port = None if config.metrics_port is None else config.metrics_port + index
        child_config = replace(config, metrics_port=port)
        children.append(ctx.Process(target=_child, name=f"leaseq-worker-{index}",
                                    args=(app_ref, url, child_config, log_level)))
    # The parent's stop signals are its own before the first child starts: a SIGTERM in
    # between would have ended the parent by default and left the children unsupervised.
    with StopSignals() as signals:
        for child in children:
            child.start()
        return _supervise(children, signals, burst=config.burst)


def _supervise(children: list[Any], signals: StopSignals, *, burst: bool = False) -> int:
    """Wait for the children; forward each stop signal to them as SIGTERM (a second one makes
    a worker exit at once). After a crash, stop the others too; so too, outside ``burst``,
    after a child that ended cleanly with no stop asked of the parent (a stop sent to its pid
    alone): the rest would serve on at reduced strength, unseen. The status: 1 when a child
    crashed or so ended, else ``EXIT_SECOND_SIGNAL`` when a second stop ended one at once,
    else 0."""
    stopping = False
    crashed = forced = False
    running = list(children)
    while running:
        wait([*(c.sentinel for c in running), signals.fileno()], timeout=1.0)
        for _ in range(signals.take()):
            stopping = True
            _terminate(running)
        for child in [c for c in running if c.exitcode is not None]:
            running.remove(child)
            if stopping and child.exitcode == EXIT_SECOND_SIGNAL:
                forced = True
                log.warning("%s (pid %s) exited at once on a second stop signal; its "
                            "in-flight jobs come back when their leases expire",
                            child.name, child.pid)
            elif _crashed(child, stopping) or _left_alone(child, stopping, burst):
                crashed = True
                log.error("%s (pid %s) exited with status %s%s", child.name, child.pid,
                          child.exitcode, "" if child.exitcode else
                          " though no stop was asked of the workers; stopping the others")
                if not stopping:
                    stopping = True
                    _terminate(running)
    return 1 if crashed else EXIT_SECOND_SIGNAL if forced else 0


def _crashed(child: Any, stopping: bool) -> bool:
    # A child still starting up when the stop came dies of the SIGTERM itself (its handler is
    # not installed yet): that is the stop, not a crash.
    return bool(child.exitcode != 0 and not (stopping and child.exitcode == -signal.SIGTERM))


def _left_alone(child: Any, stopping: bool, burst: bool) -> bool:
    # Outside --burst a worker ends only when stopped: ended cleanly with no stop asked of
    # the parent, it was stopped on its own.
    return child.exitcode == 0 and not stopping and not burst


def _terminate(children: list[Any]) -> None:
    for child in children:
        if child.is_alive() and child.pid:
            os.kill(child.pid, signal.SIGTERM)
