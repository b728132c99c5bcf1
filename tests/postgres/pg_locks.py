"""Making a PostgreSQL race happen: wait until sessions queue behind a lock another holds."""

from __future__ import annotations

import time

import psycopg
import pytest

QUEUED_BEHIND = """
SELECT count(*) FROM pg_stat_activity a
WHERE %(holder)s = ANY(pg_blocking_pids(a.pid))
   OR EXISTS (SELECT 1 FROM pg_stat_activity b
              WHERE b.pid = ANY(pg_blocking_pids(a.pid))
                AND %(holder)s = ANY(pg_blocking_pids(b.pid)))"""


def until_blocked_by(pg_url: str, holder_pid: int, waiters: int = 1,
                     timeout_s: float = 30.0) -> None:
    """Return once ``waiters`` sessions wait on a lock ``holder_pid`` holds, directly or
    queued behind one that does (a second waiter on a row waits on the first's tuple lock);
    fails the test after ``timeout_s``. The moment to let the holder commit."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            row = conn.execute(QUEUED_BEHIND, {"holder": holder_pid}).fetchone()
            if row and row[0] >= waiters:
                return
            time.sleep(0.005)
    pytest.fail(f"{waiters} session(s) never waited on the holder's lock")
