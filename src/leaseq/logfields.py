"""The ``extra=`` of leaseq's log records about work: ``action``, ``queue``, ``job_id`` and
``attempt`` become attributes of the ``LogRecord``, so an operator filters on them
(``action=lease_lost queue=exports``) instead of parsing prose, as Procrastinate does. A
formatter may show them (``%(action)s %(queue)s %(job_id)s``); a record about no particular
job carries None for the fields it has no value for.

Actions the worker, runner, heartbeat and RabbitMQ consumer log (see docs/worker.md):
``worker_started``, ``burst_done``, ``claim_failed``, ``sweep_failed``, ``worker_error``,
``stopping``, ``given_back``, ``give_back_failed``, ``lease_lost``, ``save_failed``,
``invalid``, ``permanent``, ``unstorable_result``, ``retry_requested``, ``handler_raised``,
``heartbeat_failed``, ``heartbeat_every``, ``lease_abandoned``, ``consuming``,
``grace_expired``, ``unsettled``, ``settle_failed``, ``journal_failed``; and
the RabbitMQ topology's ``holding_queue_limited``.
"""

from __future__ import annotations

from typing import Any

from leaseq.job import Job

#: The attributes every such record carries.
FIELDS = ("action", "queue", "job_id", "attempt")


def job_fields(action: str, job: Job) -> dict[str, Any]:
    """``extra=`` for a record about one job (its attempt as the job record counts it)."""
    return {"action": action, "queue": job.queue, "job_id": job.id, "attempt": job.attempts}


def queue_fields(action: str, queue: str | None = None,
                 job_id: str | None = None) -> dict[str, Any]:
    """``extra=`` for a record about a queue (or none), or a job known only by its id."""
    return {"action": action, "queue": queue, "job_id": job_id, "attempt": None}
