"""The worker registry's beat of a RabbitMQ consumer.

A polling worker beats from its lease heartbeat (``Heartbeat.on_tick``). A consumer has no
heartbeat of its own while idle (its executor's beats only the leases it holds), yet the
dashboard's workers page and ``leaseq doctor``'s "ready and no live worker" read the
registry: a consumer missing from it made a backlog read as a queue nobody serves. So a
thread of its own beats every ``TICK_EVERY_S``, busy or idle, and the registry forgets the
consumer when it stops cleanly (a killed one is pruned by the sweeper, as a worker is).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from types import TracebackType

from leaseq.deadline import within
from leaseq.errors import LeaseqError
from leaseq.heartbeat import TICK_BOUND_S, TICK_EVERY_S
from leaseq.job import safe_reason
from leaseq.queue import Queue
from leaseq.redact import Redact, redact
from leaseq.stores.base import Store

log = logging.getLogger(__name__)


class RegistryBeat:
    """``with RegistryBeat(worker_id, queues, in_flight):`` registers ``worker_id`` for
    ``queues`` (on each of their stores) at once and every ``every_s`` seconds, with
    ``in_flight()`` jobs held; unregisters it on the way out. A beat that fails is logged
    (masked by ``redact``) and never stops the consumer: the registry is for people."""

    def __init__(self, worker_id: str, queues: Sequence[Queue], in_flight: Callable[[], int],
                 *, redact: Redact = redact, every_s: float = TICK_EVERY_S):
        self.worker_id = worker_id
        self.in_flight = in_flight
        self.redact = redact
        self.every_s = every_s
        by_store: dict[int, tuple[Store, list[str]]] = {}
        for queue in queues:
            by_store.setdefault(id(queue.store), (queue.store, []))[1].append(queue.name)
        self._stores = list(by_store.values())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leaseq-registry", daemon=True)

    def __enter__(self) -> RegistryBeat:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        for store, _ in self._stores:
            with contextlib.suppress(LeaseqError):  # an unreachable store prunes it later
                store.unregister_worker(self.worker_id)

    def _run(self) -> None:
        while True:
            self.beat()
            if self._stop.wait(self.every_s):
                return

    def beat(self) -> None:
        """Register the worker on each store now."""
        for store, names in self._stores:
            try:
                with within(TICK_BOUND_S):
                    store.register_worker(self.worker_id, names, self.in_flight())
            except Exception as exc:  # never the consumer's end: see the class's docstring
                log.warning("consumer %s: worker registry beat failed: %s", self.worker_id,
                            safe_reason(exc, redact=self.redact))
