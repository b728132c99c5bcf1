"""The sweeper: reclaim expired leases in every queue, then purge old terminal jobs.

Idempotent and safe to run in several places at once (each step is one store transaction);
every worker runs it every ``sweep_every_s`` too. Claims heal expired leases on their own, so
the sweeper's reclaim mostly makes the state (and the ready count an autoscaler reads) honest
sooner, and buries spent jobs as ``failed(expired)`` (and pending ones nothing could ever
claim as ``failed(exhausted)``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from leaseq import validate
from leaseq.errors import InvalidInput, LeaseqError
from leaseq.job import safe_reason
from leaseq.queue import Queue
from leaseq.stores.base import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SweeperConfig:
    every_s: float = 30.0
    """Seconds between sweeps when run as a loop. Defaults to 30 s."""
    retention_s: Mapping[str, float] = field(default_factory=dict)
    """Terminal status → seconds to keep a job after its last update, e.g.
    ``{"done": 7 * 86400, "tombstone": 30 * 86400}``. Defaults to keeping everything: a purged
    job id is forgotten, so a replay of it would create a new job."""

    workers_gone_after_s: float = 300.0
    """Seconds after its last registry beat that a worker is forgotten (a killed worker never
    unregisters). Defaults to 300 s, thirty registry beats."""

    def __post_init__(self) -> None:
        validate.delay_s(self.every_s, "every_s")
        validate.delay_s(self.workers_gone_after_s, "workers_gone_after_s")
        if self.every_s <= 0:
            raise InvalidInput("every_s must be > 0")
        for status, age in self.retention_s.items():
            validate.terminal_status(status)
            validate.delay_s(age, f"retention for {status}")


@dataclass(frozen=True, slots=True)
class SweepResult:
    queue: str
    expired: int = 0
    """Spent jobs whose lease ran out, quarantined as ``failed(expired)``, and pending jobs
    whose attempts were spent (older data), quarantined as ``failed(exhausted)``."""
    reclaimed: int = 0
    """Jobs whose lease ran out with attempts left: ready again."""
    purged: int = 0


def run_once(store: Store, config: SweeperConfig | None = None,
             queues: Sequence[str] | None = None, *, purge: Collection[str] | None = None,
             on_queue: Callable[[SweepResult], None] | None = None) -> list[SweepResult]:
    """One sweep over every queue of the store (or just ``queues``); one result per queue.
    ``purge``: the queues whose retention applies (default: every queue swept): a worker
    purges only the queues it serves, and another app's jobs stay as long as that app keeps
    them. ``on_queue`` is called with each queue's result as soon as it is swept. A queue whose
    sweep fails (a purge cut at its deadline, say) is logged and the next queues are swept all
    the same; the first such error is raised once every queue had its turn (the queues swept
    before and after it were told to ``on_queue``)."""
    config = config or SweeperConfig()
    store.prune_workers(config.workers_gone_after_s)
    results, failed = [], []
    for name in queues or store.queues():
        try:
            result = _sweep_queue(Queue(store, name), config, purge is None or name in purge)
        except LeaseqError as exc:
            log.warning("sweep of queue %s failed; sweeping the others: %s", name,
                        safe_reason(exc))
            failed.append(exc)
            continue
        results.append(result)
        if on_queue:
            on_queue(result)
    if failed:
        raise failed[0]
    return results


def _sweep_queue(queue: Queue, config: SweeperConfig, purge: bool) -> SweepResult:
    expired, reclaimed = queue.reclaim_expired()
    purged = queue.purge(config.retention_s) if purge and config.retention_s else 0
    return SweepResult(queue.name, expired, reclaimed, purged)


def run_forever(store: Store, config: SweeperConfig | None = None, *,
                queues: Sequence[str] | None = None, stop: threading.Event | None = None,
                on_sweep: Callable[[list[SweepResult]], None] | None = None) -> None:
    """Sweep every ``config.every_s`` until ``stop`` is set. A failed sweep is logged (its
    error through the built-in redactor: no app here) and tried again next time: a database
    that is briefly away must not end the loop. ``on_sweep`` gets each sweep's results, those
    of the queues swept when another's failed too."""
    config = config or SweeperConfig()
    stop = stop or threading.Event()
    while not stop.is_set():
        swept: list[SweepResult] = []
        failed = False
        try:
            run_once(store, config, queues, on_queue=swept.append)
        except LeaseqError as exc:
            failed = True
            log.warning("sweep failed, will try again in %.0f s: %s", config.every_s,
                        safe_reason(exc))
        if on_sweep and (swept or not failed):  # the queues swept, though another failed
            on_sweep(swept)
        stop.wait(config.every_s)
