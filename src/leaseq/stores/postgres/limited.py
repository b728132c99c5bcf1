"""The PostgreSQL store's limited claim (docs/limits.md): per-key concurrency and the sliding
rate, in one transaction behind the queue's limits row lock (see queries/limits.sql: the claim
statement's snapshot is taken after the lock is held, so the counts it reads stay true until
it commits); and the held-back counts. Mixed into ``PostgresStore``, whose plumbing it uses
(its ``claim`` and ``claim_one`` call in here)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row, tuple_row

from leaseq.job import Job
from leaseq.limits import (
    UNKEYED_SCAN,
    ClaimLimits,
    HeldBack,
    LimitsState,
    admit,
    held_back,
    key_backlog,
    record,
)
from leaseq.stores.postgres.operators import free_text
from leaseq.stores.postgres.session import Sessions, lock_timeout


class LimitedClaims:
    """``claim`` and ``claim_one`` under ``ClaimLimits``, and ``held_back``, on PostgreSQL."""

    queries: dict[str, str]
    time_offset_s: float
    _session: Sessions
    _rows: Callable[..., list[dict[str, Any]]]
    _jobs: Callable[..., list[Job]]
    _exec: Callable[..., None]
    _count: Callable[..., int]
    _decode: Callable[[dict[str, int], list[tuple[Any, ...]]], list[Job]]

    def _claim_limited(self, conn: psycopg.Connection, queue: str, worker_id: str, limit: int,
                       lease_s: float, limits: ClaimLimits, token: uuid.UUID,
                       job_id: str | None = None) -> list[Job]:
        """The claim under ``limits``, in one transaction behind the queue's limits row lock
        (see queries/limits.sql), its jobs stamped with ``token``. ``job_id``: only that job."""
        state = self._limit_lock(conn, queue)
        at = state.at()
        if limits.rate_per_s is not None:
            limit = admit(state.recent, at, limit, limits.rate_per_s)
        params = {"queue": queue, "worker_id": free_text(worker_id), "lease_s": lease_s,
                  "token": token}
        if not limit:
            jobs: list[Job] = []
        elif job_id is not None:
            jobs = self._jobs(conn, "claim_one", id=job_id, key_limit=limits.key_limit,
                              **params)
        elif limits.key_limit is None:
            jobs = self._jobs(conn, "claim", limit=limit, **params)
        else:
            jobs = self._jobs(conn, "claim_keyed", limit=limit, key_limit=limits.key_limit,
                              scan=limit + UNKEYED_SCAN, **params)
        rate = limits.rate_per_s
        if (rate is not None and jobs) or state.recorded != limits:
            recent = (record(state.recent, at, len(jobs), rate) if rate is not None and jobs
                      else state.recent)
            self._exec(conn, "save_limits", queue=queue, recent=recent,
                       key_limit=limits.key_limit, rate_per_s=limits.rate_per_s)
        return jobs

    def _claim_keyed(self, conn: psycopg.Connection, queue: str, worker_id: str, limit: int,
                     lease_s: float, key_limit: int, token: uuid.UUID) -> list[Job]:
        """A key-limited claim without a rate, its transaction sent in one round trip: the
        server runs the statements in order, so the claim's snapshot (READ COMMITTED: taken
        when the statement starts) comes after the lock on the queue's limits row is held,
        as in ``_claim_limited`` (every leaseq session is READ COMMITTED: session.py). Nothing
        the claim needs is decided in between."""
        return self._pipelined_claim(
            conn, "claim_keyed", {"queue": queue, "worker_id": free_text(worker_id),
                                  "lease_s": lease_s, "token": token, "limit": limit,
                                  "key_limit": key_limit, "scan": limit + UNKEYED_SCAN},
            first=("key_limit_lock", {"queue": queue, "key_limit": key_limit}))

    def _pipelined_claim(self, conn: psycopg.Connection, name: str, params: dict[str, Any],
                         first: tuple[str, dict[str, Any]] | None = None) -> list[Job]:
        """The claim ``name`` in a transaction of its own sent in one round trip, after the
        statement ``first`` when given, waiting for a lock no longer than the try may last
        (``lock_timeout``: a claim still waiting when its caller gave up would take its jobs
        for nobody). Inside a caller's transaction (a django:// store in atomic(): its
        savepoint) the statements join it; a COMMIT of ours would end the caller's."""
        off = float(self.time_offset_s)
        claim = conn.cursor(row_factory=tuple_row)
        own = conn.info.transaction_status == TransactionStatus.IDLE
        wait = lock_timeout(conn) if own else None
        with conn.pipeline():
            if own:
                conn.execute("BEGIN")
            if wait is not None:
                conn.execute(wait)
            if first is not None:
                conn.execute(self.queries[first[0]], {**first[1], "off": off})
            claim.execute(self.queries[name], {**params, "off": off}, prepare=True)
            if own:
                conn.execute("COMMIT")
        rows = claim.fetchall()
        return self._decode({c.name: i for i, c in enumerate(claim.description or [])}, rows)

    def _limit_lock(self, conn: psycopg.Connection, queue: str) -> LimitsState:
        """Lock the queue's limits row (made on first use) and read it; in a transaction of
        leaseq's own, waiting no longer than the try (``lock_timeout``)."""
        wait = lock_timeout(conn)
        if wait is None:
            rows = self._rows(conn, "limit_lock", queue=queue)
        else:
            with conn.cursor(row_factory=dict_row) as lock:
                with conn.pipeline():  # the setting and the lock in one round trip
                    conn.execute(wait)
                    lock.execute(self.queries["limit_lock"],
                                 {"queue": queue, "off": float(self.time_offset_s)})
                rows = lock.fetchall()
        if not rows:
            self._exec(conn, "limit_row", queue=queue)
            rows = self._rows(conn, "limit_lock", queue=queue)
        return _limits_state(rows[0])

    def held_back(self, queue: str, limits: ClaimLimits | None = None) -> HeldBack:
        def work(conn: psycopg.Connection) -> HeldBack:
            state = _limits_state(self._rows(conn, "limits_row", queue=queue)[0])
            asked = state.recorded if limits is None else limits
            if not asked.any:
                return HeldBack()
            ready = self._count(conn, "ready", queue=queue)
            by_key = 0
            if asked.key_limit is not None:
                by_key = key_backlog([(r["ready"], r["running"]) for r in
                                      self._rows(conn, "key_backlog", queue=queue)],
                                     asked.key_limit)
            return held_back(ready, by_key, asked)

        return self._session.run(work, idempotent=True)

    def forget_limits(self, queue: str) -> None:
        self._session.run(lambda conn: self._exec(conn, "forget_limits", queue=queue),
                          idempotent=True, autocommit=True)

    def limited_queues(self) -> dict[str, ClaimLimits]:
        def work(conn: psycopg.Connection) -> dict[str, ClaimLimits]:
            return {r["queue"]: ClaimLimits(r["key_limit"], r["rate_per_s"])
                    for r in self._rows(conn, "limited_queues")}

        return self._session.run(work, idempotent=True)


def _limits_state(row: dict[str, Any]) -> LimitsState:
    """A queue's limits row (all NULL when it has none) as ``LimitsState``."""
    return LimitsState(list(row["recent"] or []),
                       ClaimLimits(row["key_limit"], row["rate_per_s"]), float(row["now"]))
