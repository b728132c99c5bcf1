"""Why a delivery claimed nothing, as the consumer journals it (``ack_sent`` reason): an
operator reading a job's story must be told what to do about a job left pending."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

pytest.importorskip("pika", reason="leaseq[rabbitmq] is not installed")

from leaseq.delivery.consumer import _why_not
from leaseq.job import Job

AT = datetime(2026, 1, 1, tzinfo=UTC)


def pending() -> Job:
    return Job(id="j", queue="q", status="pending", payload={}, attempts=0, max_attempts=5,
               lease_until=AT, created_at=AT, updated_at=AT)


def test_a_pending_job_of_a_limited_queue_names_the_limits_and_the_way_out() -> None:
    # A limit that held it back leaves it pending with its publish marked: only a republish
    # delivers it again (it said "not due yet", which sent operators to wait)
    assert "limits" in _why_not(pending(), limited=True)
    assert "leaseq rabbitmq republish" in _why_not(pending(), limited=True)
    assert _why_not(pending()) == "not due yet"
