"""Broker delivery through RabbitMQ (DESIGN.md §5): the entry points.

The database stays the truth; RabbitMQ only carries wake-ups (a job id, never the payload).

* ``run_dispatcher``: the transactional outbox's publisher (``leaseq dispatch``).
* ``run_consumer`` / ``run_app_consumer``: push delivery into the same handler and outcome
  logic as the polling worker (``leaseq worker MODULE:APP --delivery rabbitmq``).
* ``Topology``: exchange and queue names and arguments, declared idempotently and checked at
  start-up (``TopologyError`` when the dead-letter route is missing or differs).

docs/rabbitmq.md has the guarantees and the runbook.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from leaseq.delivery.consumer import (
    Consumer,
    ConsumerConfig,
    Execute,
    ExecuteClaimed,
    new_worker_id,
)
from leaseq.delivery.dispatcher import Dispatcher, DispatcherConfig
from leaseq.delivery.execute import AppExecutor
from leaseq.delivery.topology import Topology
from leaseq.signals import stop_event

if TYPE_CHECKING:
    from leaseq.app import App
    from leaseq.queue import Queue
    from leaseq.stores.base import Store

__all__ = [
    "AppExecutor",
    "Consumer",
    "ConsumerConfig",
    "Dispatcher",
    "DispatcherConfig",
    "Execute",
    "ExecuteClaimed",
    "Topology",
    "declare_topology",
    "new_worker_id",
    "run_app_consumer",
    "run_consumer",
    "run_dispatcher",
]


def run_dispatcher(queues: Sequence[Queue], amqp_url: str, *,
                   stop: threading.Event | None = None, topology: Topology | None = None,
                   config: DispatcherConfig | None = None, declare: bool = True,
                   discover: Store | None = None) -> None:
    """Publish the outbox of ``queues`` until ``stop`` is set (or SIGTERM / SIGINT when no
    ``stop`` is given); with ``discover``, also of the queues that store holds later (read
    every ``config.discover_every_s``). Raises ``TopologyError`` when the dead-letter route
    is wrong."""
    dispatcher = Dispatcher(queues, amqp_url, topology=topology, config=config,
                            declare=declare, discover=discover)
    with _stop_on_signals(stop) as event:
        dispatcher.run(event)


def run_consumer(queues: Sequence[Queue], execute: Execute, amqp_url: str, *,
                 stop: threading.Event | None = None, topology: Topology | None = None,
                 config: ConsumerConfig | None = None, worker_id: str | None = None,
                 declare: bool = True) -> None:
    """Consume deliveries of ``queues`` and run each claimed job with ``execute`` until
    ``stop`` is set (or SIGTERM / SIGINT). Raises ``TopologyError`` as ``run_dispatcher``."""
    consumer = Consumer(queues, execute, amqp_url, topology=topology, config=config,
                        worker_id=worker_id, declare=declare)
    with _stop_on_signals(stop) as event:
        consumer.run(event)


def run_app_consumer(app: App, amqp_url: str, *, queues: Sequence[str] = (),
                     store: Store | None = None, concurrency: int = 10, grace_s: float = 30.0,
                     stop: threading.Event | None = None, topology: Topology | None = None,
                     worker_id: str | None = None) -> None:
    """``leaseq worker MODULE:APP --delivery rabbitmq``: consume the app's queues (or
    ``queues``) and run their tasks exactly as the polling worker does."""
    if store is not None:
        app.use_store(store)
    names = list(queues) or app.queue_names()
    execute = AppExecutor(app)
    try:
        run_consumer([app.queue(n) for n in names], execute, amqp_url, stop=stop,
                     topology=topology, worker_id=worker_id,
                     config=ConsumerConfig(concurrency=concurrency, grace_s=grace_s))
    finally:
        execute.close()


def declare_topology(queue_names: Sequence[str], amqp_url: str, *,
                     topology: Topology | None = None, declare: bool = True
                     ) -> list[tuple[str, str]]:
    """Declare (or with ``declare=False`` only check) the topology of ``queue_names``.
    Returns ``(queue, holding queue)`` for each holding queue left with RabbitMQ 4's default
    delivery limit (logged too: ``Topology.ensure``)."""
    from leaseq.delivery.connection import session

    topology = topology or Topology()
    with session(amqp_url, "leaseq-topology") as conn:
        return topology.ensure(conn, queue_names, declare=declare, warned=set())


@contextmanager
def _stop_on_signals(stop: threading.Event | None) -> Iterator[threading.Event]:
    """The caller's event, or one that SIGTERM / SIGINT set (main thread only) through
    ``leaseq.signals``: a watcher thread sets it, never the signal handler, which could land
    while the main thread holds the Event's own lock."""
    if stop is not None:
        yield stop
        return
    with stop_event() as event:
        yield event
