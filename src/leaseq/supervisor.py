"""``leaseq worker --processes P``: P worker processes (spawn) under one supervising parent.

The parent forwards SIGTERM / SIGINT to its children as SIGTERM (children ignore SIGINT, so a
Ctrl-C in a terminal reaches each of them once, through the parent) and exits non-zero if a
child crashed. After a crash it stops the other children too: the orchestrator that started
the parent is the one to restart it, and a half-strength worker would hide the crash.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import signal
import sys
from dataclasses import replace
from multiprocessing.connection import wait
from typing import Any

from leaseq.app import App
from leaseq.errors import InvalidInput
from leaseq.stores import connect
from leaseq.worker import Worker, WorkerConfig

log = logging.getLogger("leaseq.worker")


def load_app(ref: str) -> App:
    """``module:attribute`` → the ``App`` it names. The current directory is importable, as
    it is for ``python -m``."""
    module_name, sep, attribute = ref.partition(":")
    if not sep or not module_name or not attribute:
        raise InvalidInput(f"expected MODULE:APP (e.g. myproject.tasks:app), got {ref!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInput(f"cannot import module {module_name!r}: {exc}") from None
    for part in attribute.split("."):
        target = getattr(target, part, None)
    if not isinstance(target, App):
        raise InvalidInput(f"{ref!r} is not a leaseq.App (got {type(target).__name__})")
    return target


def run_worker(app_ref: str, url: str | None, config: WorkerConfig, *,
               ignore_sigint: bool = False) -> int:
    """Run one worker in this process until stopped; returns the exit status."""
    app = load_app(app_ref)
    if url:
        app.use_store(connect(url))
    if ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker = Worker(app, config)
    worker.run(handle_signals=True)
    if worker.has_stragglers():
        # A handler thread outlived the grace period (its job was given back); a normal exit
        # would wait for it.
        logging.shutdown()
        sys.stdout.flush()
        os._exit(0)
    return 0


def _child(app_ref: str, url: str | None, config: WorkerConfig, log_level: int) -> None:
    logging.basicConfig(level=log_level, format="%(asctime)s %(processName)s %(levelname)s "
                                                "%(name)s: %(message)s")
    sys.exit(run_worker(app_ref, url, config, ignore_sigint=True))


def run_processes(app_ref: str, url: str | None, config: WorkerConfig, processes: int,
                  log_level: int = logging.INFO) -> int:
    """Start ``processes`` workers and supervise them; 0 when all ended cleanly, else 1."""
    load_app(app_ref)  # fail here, once, rather than in every child
    ctx = multiprocessing.get_context("spawn")
    children = []
    for index in range(processes):
        port = None if config.metrics_port is None else config.metrics_port + index
        child_config = replace(config, metrics_port=port)
        children.append(ctx.Process(target=_child, name=f"leaseq-worker-{index}",
                                    args=(app_ref, url, child_config, log_level)))
    for child in children:
        child.start()
    return _supervise(children)


def _supervise(children: list[Any]) -> int:
    stopping = False

    def forward(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            if child.is_alive() and child.pid:
                os.kill(child.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    status = 0
    try:
        running = list(children)
        while running:
            wait([c.sentinel for c in running], timeout=1.0)
            for child in [c for c in running if c.exitcode is not None]:
                running.remove(child)
                # A child still starting up when the stop came dies of the SIGTERM itself
                # (its handler is not installed yet): that is the stop, not a crash.
                if child.exitcode != 0 and not (stopping and child.exitcode == -signal.SIGTERM):
                    log.error("%s (pid %s) exited with status %s", child.name, child.pid,
                              child.exitcode)
                    status = 1
                    if not stopping:
                        forward(signal.SIGTERM, None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status
