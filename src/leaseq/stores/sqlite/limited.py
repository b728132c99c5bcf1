"""The SQLite store's limited claim (docs/limits.md): per-key concurrency and the sliding
rate, checked under ``BEGIN IMMEDIATE``, which already holds every other claim off, so the
counts read here stay true until the commit; and the held-back counts. Mixed into
``SQLiteStore``, whose plumbing it uses (its ``claim`` and ``claim_one`` call in here)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from leaseq.limits import (
    NO_LIMITS,
    UNKEYED_SCAN,
    ClaimLimits,
    FrontFirst,
    HeldBack,
    LimitsState,
    admit,
    held_back,
    key_backlog,
    record,
    window_size,
)


class LimitedClaims:
    """``claim`` and ``claim_one`` under ``ClaimLimits``, and ``held_back``, on SQLite."""

    _front_first: FrontFirst
    _rows: Callable[..., list[dict[str, Any]]]
    _tx: Callable[..., AbstractContextManager[sqlite3.Connection]]
    _reading: Callable[[], AbstractContextManager[sqlite3.Connection]]

    def _claim_limited(self, conn: sqlite3.Connection, queue: str, worker_id: str, limit: int,
                       lease_s: float, limits: ClaimLimits,
                       job_id: str | None = None) -> list[dict[str, Any]]:
        """The claim under ``limits``; BEGIN IMMEDIATE already holds every other claim off,
        so the counts read here stay true until the commit. ``job_id``: only that job."""
        params = {"queue": queue, "worker_id": worker_id, "lease_s": lease_s}
        if limits.rate_per_s is None and limits.key_limit is not None and job_id is None:
            return self._claim_keyed(conn, limit, limits.key_limit, params)
        state = self._limits_state(conn, queue)
        at = state.at()
        if limits.rate_per_s is not None:
            limit = admit(state.recent, at, limit, limits.rate_per_s)
        if not limit:
            rows: list[dict[str, Any]] = []
        elif job_id is not None:
            rows = (self._rows(conn, "claim_one", id=job_id, **params)
                    if self._key_has_room(conn, queue, job_id, limits) else [])
        elif limits.key_limit is None:
            rows = self._rows(conn, "claim", limit=limit, **params)
        else:
            rows = self._rows(conn, "claim_keyed", limit=limit, key_limit=limits.key_limit,
                              scan=limit + UNKEYED_SCAN, **params)
        rate = limits.rate_per_s
        if (rate is not None and rows) or state.recorded != limits:
            recent = (record(state.recent, at, len(rows), rate) if rate is not None and rows
                      else state.recent)
            self._rows(conn, "save_limits", queue=queue, recent=json.dumps(recent),
                       key_limit=limits.key_limit, rate_per_s=limits.rate_per_s)
        return rows

    def _claim_keyed(self, conn: sqlite3.Connection, limit: int, key_limit: int,
                     params: dict[str, Any]) -> list[dict[str, Any]]:
        """A key-limited claim without a rate: no rate log to read or write. It records the
        limits (when they changed), reads the queue's front and its keys' running counts,
        and claims what they decide (``first_within_key_limits``); when they cannot, it
        walks every key (``claim_keyed``). The front decides whenever the limits let
        ``limit`` of it run: then it costs what a plain claim's walk does, however many keys
        have live jobs, where the key walk seeks each of them."""
        self._rows(conn, "record_key_limit", queue=params["queue"], key_limit=key_limit)
        chosen = (self._decide_from_front(conn, limit, key_limit, params["queue"])
                  if self._front_first.worth_reading(params["queue"]) else None)
        if chosen is None:
            return self._rows(conn, "claim_keyed", limit=limit, key_limit=key_limit,
                              scan=limit + UNKEYED_SCAN, **params)
        if not chosen:
            return []
        return self._rows(conn, "claim_rowids", rids=json.dumps(chosen), **params)

    def _decide_from_front(self, conn: sqlite3.Connection, limit: int, key_limit: int,
                           queue: str) -> list[int] | None:
        """The rowids the queue's front decides to claim, or None (``FrontFirst`` told)."""
        size = window_size(limit)
        window = [(r["rid"], r["concurrency_key"]) for r in self._rows(
            conn, "keyed_window", queue=queue, window=size)]
        keys = sorted({key for _, key in window if key is not None})
        running = {r["concurrency_key"]: r["running"] for r in self._rows(
            conn, "keys_running", queue=queue, keys=json.dumps(keys),
            key_limit=key_limit)} if keys else {}
        return self._front_first.decide(queue, window, running, limit, key_limit, size)

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

    def held_back(self, queue: str, limits: ClaimLimits | None = None) -> HeldBack:
        with self._reading() as conn:
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
            return held_back(ready, by_key, limits)

    def forget_limits(self, queue: str) -> None:
        with self._tx() as conn:
            self._rows(conn, "forget_limits", queue=queue)

    def limited_queues(self) -> dict[str, ClaimLimits]:
        with self._reading() as conn:
            return {r["queue"]: ClaimLimits(r["key_limit"], r["rate_per_s"])
                    for r in self._rows(conn, "limited_queues")}
