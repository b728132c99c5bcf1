"""The PostgreSQL store's enqueue: the one-statement fast path for new ids and replays, and
the careful path (rows locked, each job decided, a lost insert race decided again) inside a
savepoint of the caller's or the store's own transaction. Mixed into ``PostgresStore``, whose
plumbing it uses."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg.errors import UniqueViolation

from leaseq.errors import InvalidInput, JobConflict, StoreUnavailable
from leaseq.job import EnqueueOutcome, EnqueueResult, JobSpec, OnConflict
from leaseq.stores.postgres.options import PostgresOptions
from leaseq.stores.postgres.plan import EnqueuePlan, enqueued_data
from leaseq.stores.postgres.session import Sessions

_SAVEPOINT = "leaseq_enqueue"
#: How often one enqueue decides again after losing an insert race to a concurrent enqueue.
#: Every loss means a competing transaction committed (its rows are then seen and decided like
#: any existing job), so losses are bounded by the number of concurrent producers of the same
#: new ids; 64 leaves room for dozens of them.
_INSERT_RACES = 64


class PostgresEnqueue:
    """``enqueue_many`` of ``Store`` (see ``leaseq.stores.base``) on PostgreSQL."""

    _session: Sessions
    options: PostgresOptions
    _rows: Callable[..., list[dict[str, Any]]]
    _tuples: Callable[..., tuple[dict[str, int], list[tuple[Any, ...]]]]
    _exec: Callable[..., None]
    _notify: Callable[[psycopg.Connection, str], None]

    # --- producers -------------------------------------------------------------------------

    def enqueue_many(self, queue: str, specs: Sequence[JobSpec], on_conflict: OnConflict = "raise",
                     connection: Any = None) -> list[EnqueueResult]:
        check_text(specs)
        if connection is None:
            # New ids: one autocommitted statement, prepared and planned once (it reads
            # nothing: see enqueue_fast and enqueue_one). Anything else: the careful path, in a
            # transaction of its own (the fast try wrote nothing then).
            fast = self._enqueue_one if len(specs) == 1 else self._enqueue_fast
            results = self._session.run(lambda conn: fast(conn, queue, specs),
                                        autocommit=True, generic_plans=True)
            if results is not None:
                return results
            return self._session.run(
                lambda conn: self._enqueue(conn, queue, specs, on_conflict, fast=False))
        if not isinstance(connection, psycopg.Connection):
            raise TypeError("connection= must be a psycopg.Connection on the PostgreSQL store")
        idle = connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if connection.autocommit and idle:
            raise InvalidInput("connection= is in autocommit mode with no open transaction: "
                               "open one first (with connection.transaction(): ...)")
        return self._enqueue(connection, queue, specs, on_conflict)

    def _enqueue(self, conn: psycopg.Connection, queue: str, specs: Sequence[JobSpec],
                 on_conflict: OnConflict, fast: bool = True) -> list[EnqueueResult]:
        """Enqueue inside ``conn``'s transaction, under a savepoint: a conflict or an error
        undoes only this call (the caller's transaction stays usable), and a lost insert race
        is decided again with the winner's row locked."""
        check_text(specs)
        for _ in range(_INSERT_RACES):
            conn.execute(f"SAVEPOINT {_SAVEPOINT}")
            try:
                results = self._enqueue_fast(conn, queue, specs, prepare=False) if fast else None
                if results is None:
                    # The fast try wrote nothing, or failed on an existing id: start clean.
                    conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
                    results = self._enqueue_once(conn, queue, specs, on_conflict)
            except BaseException:
                if not conn.broken:
                    conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
                raise
            if results is not None:
                conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
                return results
            conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            fast = False
            time.sleep(random.uniform(0, 0.002))  # de-synchronise producers racing in step
        raise StoreUnavailable(f"queue {queue!r}: enqueue kept racing concurrent inserts of "
                               "the same ids; try again")

    def _enqueue_fast(self, conn: psycopg.Connection, queue: str, specs: Sequence[JobSpec],
                      prepare: bool = True) -> list[EnqueueResult] | None:
        """The one-statement enqueue of new ids (see ``enqueue_fast`` in queries/enqueue.sql);
        None, having written nothing, when the careful path must decide: an id repeats in the
        batch, or one exists already (a replay, an update, a conflict, a concurrent insert).
        ``prepare`` only on leaseq's own connections (a caller's may sit behind a pooler)."""
        ids = [s.job_id for s in specs]
        if not specs or len(set(ids)) != len(ids):
            return None
        try:
            self._tuples(conn, "enqueue_fast", prepare=prepare, queue=queue,
                         channel=self.options.channel, **batch_columns(specs))
        except UniqueViolation:
            return None
        return [EnqueueResult(i, EnqueueOutcome.CREATED) for i in ids]

    def _enqueue_one(self, conn: psycopg.Connection, queue: str,
                     specs: Sequence[JobSpec]) -> list[EnqueueResult] | None:
        """One new job in one prepared statement (see ``enqueue_one``); None, having written
        nothing, when the id exists: the careful path decides (replay, update, conflict)."""
        spec = specs[0]
        if spec.revision is None:
            _, rows = self._tuples(conn, "enqueue_one", queue=queue,
                                   channel=self.options.channel, **one_columns(spec))
            inserted = bool(rows)
        else:
            _, rows = self._tuples(conn, "enqueue_one_journaled", queue=queue,
                                   channel=self.options.channel, data=enqueued_data(spec),
                                   **one_columns(spec))
            inserted = bool(rows[0][0])
        return [EnqueueResult(spec.job_id, EnqueueOutcome.CREATED)] if inserted else None

    def _enqueue_once(self, conn: psycopg.Connection, queue: str, specs: Sequence[JobSpec],
                      on_conflict: OnConflict) -> list[EnqueueResult] | None:
        """One try; None when a concurrent enqueue inserted one of our new ids first."""
        ids = sorted({s.job_id for s in specs})
        rows = {r["id"]: r for r in self._rows(conn, "find_existing", queue=queue, ids=ids)}
        plan = EnqueuePlan(queue)
        for spec in specs:
            plan.decide(spec, rows.get(spec.job_id), on_conflict)
            rows.setdefault(spec.job_id, plan.inserted_row(spec))
        if plan.conflicts and on_conflict == "raise":
            raise JobConflict(queue, plan.conflicts)  # the savepoint undoes the locks
        if plan.inserts:
            won = self._rows(conn, "insert_jobs", **plan.insert_columns())
            if len(won) < len(plan.inserts):
                return None
        self._write_plan(conn, plan)
        return plan.results

    def _write_plan(self, conn: psycopg.Connection, plan: EnqueuePlan) -> None:
        if not plan.writes:
            return
        with conn.pipeline():
            for name, params in plan.updates:
                self._exec(conn, name, **params)
            if plan.journal:
                self._exec(conn, "journal_enqueued", **plan.journal_columns())
            self._notify(conn, plan.queue)


#: Plain JSON text; ensure_ascii=False leaves a lone surrogate to fail at encoding, as text
#: parameters always did.
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def batch_columns(specs: Sequence[JobSpec]) -> dict[str, Any]:
    """``enqueue_fast``'s parameters. Ids and payloads travel as one JSON array each, in batch
    order; every other column either once, as ``<name>_all``, when the whole batch shares its
    value (one task, no revision, no delay: the usual batch), or as a JSON array
    ``<name>_each`` (the other one is then None). A JSON text costs one C-level ``json`` call
    per column, where psycopg dumps a list as an array element by element in Python; a shared
    value spares the server parsing a column of copies. Payloads are spliced in as their
    texts (canonical JSON, made by ``Queue.spec``), which the server parses once. A hand-built
    ``JobSpec`` whose ``payload_json`` is not one JSON value either breaks the array (a parse
    error) or adds elements, which leaves rows without an id (a NOT NULL violation): the
    whole statement fails, never shifting its neighbours' columns."""
    columns: dict[str, Any] = dict(ids=_JSON([s.job_id for s in specs]),
                                   payloads=f"[{','.join([s.payload_json for s in specs])}]")
    varying: list[tuple[str, list[Any]]] = [
        ("task", [s.task for s in specs]),
        ("revision", [s.revision for s in specs]),
        ("delay_s", [float(s.delay_s) for s in specs]),
        ("max_attempts", [s.max_attempts for s in specs]),
        ("data", [enqueued_data(s) for s in specs]),
        ("priority", [s.priority for s in specs]),
        ("key", [s.concurrency_key for s in specs])]
    for name, values in varying:
        shared = values.count(values[0]) == len(values)
        columns[f"{name}_all"] = values[0] if shared else None
        columns[f"{name}_each"] = None if shared else _JSON(values)
    return columns


def one_columns(spec: JobSpec) -> dict[str, Any]:
    """``enqueue_one``'s parameters (``enqueue_one_journaled`` takes ``data`` too)."""
    return dict(id=spec.job_id, task=spec.task, payload=spec.payload_json,
                revision=spec.revision, delay_s=float(spec.delay_s),
                max_attempts=spec.max_attempts,
                priority=spec.priority, concurrency_key=spec.concurrency_key)


def check_text(specs: Sequence[JobSpec]) -> None:
    """PostgreSQL text holds no NUL. Each distinct task and revision is looked at once (a
    batch mostly shares them)."""
    texts = {s.task for s in specs} | {s.revision for s in specs}
    if any(text and "\x00" in text for text in texts):
        raise InvalidInput("task and revision may not contain NUL on PostgreSQL")

