"""The SQLite store's limited claim (docs/limits.md): per-key concurrency and the sliding
rate, checked under ``BEGIN IMMEDIATE``, which already holds every other claim off, so the
counts read here stay true until the commit; and the held-back counts. Mixed into
``SQLiteStore``, whose plumbing it uses (its ``claim`` and ``claim_one`` call in here)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any

from leaseq.limits import (
    NO_LIMITS,
    UNKEYED_SCAN,
    ClaimLimits,
    HeldBack,
    LimitsState,
    admit,
    free_slots,
    held_back,
    key_backlog,
    record,
)


class LimitedClaims:
    """``claim`` and ``claim_one`` under ``ClaimLimits``, and ``held_back``, on SQLite."""

    _lock: Any
    _conn: sqlite3.Connection
    _rows: Callable[..., list[dict[str, Any]]]

    def _claim_limited(self, conn: sqlite3.Connection, queue: str, worker_id: str, limit: int,
                       lease_s: float, limits: ClaimLimits,
                       job_id: str | None = None) -> list[dict[str, Any]]:
        """The claim under ``limits``; BEGIN IMMEDIATE already holds every other claim off,
        so the counts read here stay true until the commit. ``job_id``: only that job."""
        state = self._limits_state(conn, queue)
        at = state.at()
        if limits.rate_per_s is not None:
            limit = admit(state.recent, at, limit, limits.rate_per_s)
        params = {"queue": queue, "worker_id": worker_id, "lease_s": lease_s}
        if not limit:
            rows: list[dict[str, Any]] = []
        elif job_id is not None:
            rows = (self._rows(conn, "claim_one", id=job_id, **params)
                    if self._key_has_room(conn, queue, job_id, limits) else [])
        elif limits.key_limit is None:
            rows = self._rows(conn, "claim", limit=limit, **params)
        else:
            ids = self._keyed_candidates(conn, queue, limit, limits.key_limit)
            rows = self._rows(conn, "claim_chosen", ids=json.dumps(ids), **params) if ids else []
        rate = limits.rate_per_s
        if (rate is not None and rows) or state.recorded != limits:
            recent = (record(state.recent, at, len(rows), rate) if rate is not None and rows
                      else state.recent)
            self._rows(conn, "save_limits", queue=queue, recent=json.dumps(recent),
                       key_limit=limits.key_limit, rate_per_s=limits.rate_per_s)
        return rows

    def _limits_state(self, conn: sqlite3.Connection, queue: str) -> LimitsState:
        rows = self._rows(conn, "limits_row", queue=queue)
        if not rows:
            return LimitsState([], NO_LIMITS, float(self._rows(conn, "now")[0]["now"]))
        row = rows[0]
        return LimitsState(json.loads(row["recent"]),
                           ClaimLimits(row["key_limit"], row["rate_per_s"]), float(row["now"]))

    def _key_has_room(self, conn: sqlite3.Connection, queue: str, job_id: str,
                      limits: ClaimLimits) -> bool:
        if limits.key_limit is None:
            return True
        rows = self._rows(conn, "job_key_running", queue=queue, id=job_id)
        return not rows or rows[0]["running"] is None or rows[0]["running"] < limits.key_limit

    def _keyed_candidates(self, conn: sqlite3.Connection, queue: str, limit: int,
                          key_limit: int) -> list[str]:
        """Ids to claim, in claim order: each key's first ready jobs up to its free slots
        (one seek per key), and jobs without a key from the front of the claimable index."""
        found = self._rows(conn, "unkeyed_candidates", queue=queue, limit=limit,
                           scan=limit + UNKEYED_SCAN)
        for slot in self._rows(conn, "key_slots", queue=queue, key_limit=key_limit):
            free = min(free_slots(key_limit, slot["running"]), limit)
            if free:
                found += self._rows(conn, "key_candidates", queue=queue, limit=free,
                                    concurrency_key=slot["concurrency_key"])
        found.sort(key=lambda r: (-r["priority"], r["lease_until"], r["id"]))
        return [r["id"] for r in found[:limit]]

    def held_back(self, queue: str, limits: ClaimLimits | None = None) -> HeldBack:
        with self._lock:
            conn = self._conn
            state = self._limits_state(conn, queue)
            limits = state.recorded if limits is None else limits
            if not limits.any:
                return HeldBack()
            ready = int(self._rows(conn, "ready", queue=queue)[0]["n"])
            by_key = 0
            if limits.key_limit is not None:
                by_key = key_backlog([(int(r["ready"]), int(r["running"])) for r in
                                      self._rows(conn, "key_backlog", queue=queue)],
                                     limits.key_limit)
            return held_back(ready, by_key, state.recent, state.now, limits)
