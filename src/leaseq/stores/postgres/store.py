"""PostgreSQL store: psycopg 3 with a connection pool, SQL in ``queries/*.sql``.

Every primitive is one transaction, and most are one statement: a state change and its journal
event are written by one data-modifying CTE. The claim is ``SELECT … FOR UPDATE SKIP LOCKED``
inside an ``UPDATE``, so concurrent workers pass each other's rows instead of queueing on them.
Timestamps come from the server (``now()``). A lost connection is retried with backoff for
``reconnect_s`` when retrying cannot do a write twice (see ``Session``).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from datetime import UTC, datetime
from threading import Event
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from leaseq.errors import JobNotFound, MigrationRefused, StoreUnavailable
from leaseq.job import (
    Completion,
    EnqueueOutcome,
    EnqueueResult,
    Failure,
    FollowUp,
    Job,
    JobSpec,
    JournalEntry,
    Lease,
    LeaseLost,
    OnConflict,
)
from leaseq.journal import (
    GIVEN_BACK_OUT,
    HELD_BY,
    LEASE_EXPIRED_ON,
    LEASE_LOST,
    SNOOZED_OUT,
    SPENT_WHILE_PENDING_ERROR,
    STALE_REASON,
    JournalEvent,
    quarantine_reason,
    sql_literals,
)
from leaseq.limits import NO_LIMITS, ClaimLimits
from leaseq.stores.base import PURGE_BATCH, Store, require_schema
from leaseq.stores.postgres.aio import AsyncPostgres
from leaseq.stores.postgres.enqueue import PostgresEnqueue
from leaseq.stores.postgres.enqueue import check_text as _check_text
from leaseq.stores.postgres.ledger import ScheduleLedger
from leaseq.stores.postgres.limited import LimitedClaims
from leaseq.stores.postgres.listen import Listener
from leaseq.stores.postgres.operators import PostgresOperatorTools
from leaseq.stores.postgres.operators import free_text as _text
from leaseq.stores.postgres.options import PostgresOptions, parse_url
from leaseq.stores.postgres.outbox_index import Stopped as OutboxIndexStopped
from leaseq.stores.postgres.outbox_index import ensure_outbox_index
from leaseq.stores.postgres.session import Session, Sessions, tuple_cursor
from leaseq.stores.sql import latest_migration, load_queries, migrations
from leaseq.stores.sqlbase import SQLStore
from leaseq.stores.watch import NotifyWatch, finish_key

# The server's clock plus the test-only offset; now() is the start of the transaction.
NOW = "(now() + make_interval(secs => %(off)s))"
#: What a ``quarantined`` reason starts with when the query writes the why itself.
_EXHAUSTED_PREFIX = quarantine_reason(Failure.EXHAUSTED, "")
T = TypeVar("T")
#: Longest one migration try waits for a lock on leaseq's tables (and never longer than the
#: URL's ``reconnect_s``): while it waits, its queued lock holds every other session's reads
#: and writes of that table behind it.
MIGRATION_LOCK_S = 5.0


class PostgresStore(PostgresEnqueue, PostgresOperatorTools, ScheduleLedger, LimitedClaims,
                    SQLStore):
    supports_push_wakeups = True
    supports_create_false = True

    def __init__(self, conninfo: str, options: PostgresOptions, url: str, create: bool = True):
        self.options = options
        self.time_offset_s = options.time_offset_s
        self._schema = f'"{options.schema}"'  # validated: lower-case letters, digits, _
        #: This store's named SQL (``queries/*.sql`` with the schema filled in), e.g. to EXPLAIN.
        self.queries = load_queries(__package__, "queries", now=NOW, schema=self._schema,
                                    jobs=f"{self._schema}.jobs",
                                    journal=f"{self._schema}.journal",
                                    limits=f"{self._schema}.limits",
                                    schedules=f"{self._schema}.schedules",
                                    workers=f"{self._schema}.workers",
                                    created=f"'{EnqueueOutcome.CREATED.value}'", **sql_literals())
        self._columns: dict[str, dict[str, int]] = {}
        self._conninfo = conninfo
        self._session = self._open_session(conninfo, url, options)
        self.url = self._session.url
        self._session.first_use(self._migrate_in if create else self._require_schema_in)
        self._listener = Listener(conninfo, options.channel, self._wakeup_event(),
                                  finish_channel=options.finish_channel)
        self._async = AsyncPostgres(self, conninfo)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresStore:
        create = options.pop("create", True)
        conninfo, parsed = parse_url(url, **options)
        return cls(conninfo, parsed, url, create)

    # --- plumbing ---------------------------------------------------------------------------

    def _rows(self, conn: psycopg.Connection, name: str, **params: Any) -> list[dict[str, Any]]:
        params["off"] = float(self.time_offset_s)
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(self.queries[name], params)
            return cur.fetchall() if cur.description else []

    def _tuples(self, conn: psycopg.Connection, name: str, prepare: bool = True,
                **params: Any) -> tuple[dict[str, int], list[tuple[Any, ...]]]:
        """Rows as tuples, by default prepared on the server: the hot paths (claim, finishes,
        enqueue). Returns the column positions too, read from the description once per query."""
        params["off"] = float(self.time_offset_s)
        cur = tuple_cursor(conn)
        cur.execute(self.queries[name], params, prepare=prepare)
        rows = cur.fetchall() if cur.pgresult and cur.pgresult.nfields else []
        cols = self._columns.get(name)
        if cols is None and cur.description:
            cols = self._columns[name] = {c.name: i for i, c in enumerate(cur.description)}
        return cols or {}, rows

    @staticmethod
    def _decode(cols: dict[str, int], rows: list[tuple[Any, ...]]) -> list[Job]:
        """Jobs from tuple rows (limited.py reads its own cursor)."""
        return _jobs(cols, rows)

    def _jobs(self, conn: psycopg.Connection, name: str, **params: Any) -> list[Job]:
        cols, rows = self._tuples(conn, name, **params)
        return _jobs(cols, rows)

    def _read(self, name: str, **params: Any) -> list[dict[str, Any]]:
        return self._session.run(lambda conn: self._rows(conn, name, **params),
                                 idempotent=True, autocommit=True)

    @staticmethod
    def _time(value: Any) -> datetime | None:
        return _dt(value)

    @staticmethod
    def _stamp(value: Any) -> datetime:
        return value.astimezone(UTC)

    @staticmethod
    def _json(value: Any) -> Any:
        return value  # psycopg decodes json columns itself

    def _exec(self, conn: psycopg.Connection, name: str, **params: Any) -> None:
        """Send a statement whose rows are not needed (in a pipeline: without waiting)."""
        params["off"] = float(self.time_offset_s)
        conn.execute(self.queries[name], params)

    def _count(self, conn: psycopg.Connection, name: str, **params: Any) -> int:
        return int(self._rows(conn, name, **params)[0]["n"])

    def _notify(self, conn: psycopg.Connection, queue: str) -> None:
        """Wake listening workers when this transaction commits (never if it rolls back)."""
        self._exec(conn, "notify", channel=self.options.channel, queue=queue)

    # --- set-up and upkeep ------------------------------------------------------------------

    def migrate(self) -> int:
        return self._session.run(self._migrate_in)

    def _migrate_in(self, conn: psycopg.Connection) -> int:
        """Apply the migrations this schema lacks; none owed, no DDL at all, so a role that
        may only read and write rows opens a schema its owner migrated (PostgreSQL checks the
        CREATE right before it looks whether the object exists). Each try waits at most
        ``MIGRATION_LOCK_S`` for a table lock: a queued ACCESS EXCLUSIVE request stops every
        other session's reads and writes of the table behind it, so it must never wait long
        behind a report or an idle transaction (nor longer than ``reconnect_s``). Such a try
        is rolled back and made again, until ``reconnect_s`` has passed. The wait for the
        migration lock is bounded the same way: its holder may have stalled."""
        if not self._owed_migrations(conn):
            return latest_migration(__package__)
        # One migrator at a time per schema: concurrent first users wait here, then find the
        # versions the first one recorded (READ COMMITTED: each statement sees new commits).
        self._retrying_locks(conn, self._lock_migrations, (
            f"cannot open the leaseq store at {self.url}: another session has held its "
            f"migration lock for over {self.options.reconnect_s:g} s (a migration that "
            "stalled, or one still running); nothing was changed. Try again, or end that "
            "session"))
        try:
            return self._retrying_locks(conn, self._apply_migrations, (
                f"cannot upgrade the leaseq store at {self.url}: another session holds "
                f"a lock on its tables (a long report or an idle transaction); "
                f"nothing was changed. End that session, or run `leaseq migrate` "
                "when the tables are quiet"))
        except psycopg.errors.InsufficientPrivilege as exc:
            raise MigrationRefused(self.url, self._session.error_line(exc)) from None

    def _lock_migrations(self, conn: psycopg.Connection) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                     [f"leaseq.migrate.{self.options.schema}"])

    def _retrying_locks(self, conn: psycopg.Connection,
                        attempt: Callable[[psycopg.Connection], T], gave_up: str) -> T:
        """``attempt(conn)`` in a savepoint waiting at most ``MIGRATION_LOCK_S`` for a lock,
        made again while ``reconnect_s`` lasts, then ``StoreUnavailable(gave_up)``. Nothing
        waits without a bound behind a stalled migrator or a long report, and a refused try
        leaves no trace."""
        give_up = time.monotonic() + self.options.reconnect_s
        pause_s = 0.05
        while True:
            try:
                with conn.transaction():
                    conn.execute(f"SET LOCAL lock_timeout = {self._migration_lock_ms()}")
                    return attempt(conn)
            except psycopg.errors.LockNotAvailable:
                if time.monotonic() + pause_s >= give_up:
                    raise StoreUnavailable(gave_up) from None
                time.sleep(pause_s)
                pause_s = min(pause_s * 2, 1.0)

    def _migration_lock_ms(self) -> int:
        return max(int(min(MIGRATION_LOCK_S, self.options.reconnect_s) * 1000), 100)

    def _owed_migrations(self, conn: psycopg.Connection) -> list[int]:
        """The migration versions the schema has not recorded (all of them when it has no
        migrations table), read without a lock and without DDL."""
        done = self._recorded_versions(conn) or set()
        return [v for v, _, _ in migrations(__package__) if v not in done]

    def _apply_migrations(self, conn: psycopg.Connection) -> int:
        schema = self._schema
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (version integer "
                     "PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL "
                     "DEFAULT now())")
        done = {r[0] for r in conn.execute(f"SELECT version FROM {schema}.schema_migrations")}
        latest = max(done, default=0)
        for version, name, text in migrations(__package__):
            if version not in done:
                conn.execute(text.replace("{schema}", schema))
                conn.execute(f"INSERT INTO {schema}.schema_migrations (version, name) "
                             "VALUES (%s, %s)", (version, name))
                latest = version
        return latest

    def _require_schema_in(self, conn: psycopg.Connection) -> None:
        """``create=False``: the schema must be there, and not older than this code."""
        require_schema(self.url, self._schema_version_in(conn), latest_migration(__package__))

    def schema_version(self) -> int | None:
        return self._session.run(self._schema_version_in, idempotent=True)

    def _schema_version_in(self, conn: psycopg.Connection) -> int | None:
        return max(self._recorded_versions(conn) or {0}) or None

    def _recorded_versions(self, conn: psycopg.Connection) -> set[int] | None:
        """The versions ``schema_migrations`` records; None when the schema has no such table.
        Read without DDL, and the table looked up first rather than a failure caught: a
        failed statement would abort the caller's transaction on a borrowed (Django)
        connection."""
        table = f"{self._schema}.schema_migrations"
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [table]).fetchone()
        if not (row and row[0]):
            return None
        return {int(r[0]) for r in conn.execute(f"SELECT version FROM {table}")}

    def close(self) -> None:
        self._listener.close()
        self._session.close()

    def drop(self) -> None:
        self._listener.close()
        self._session.run(lambda conn: conn.execute(
            f"DROP SCHEMA IF EXISTS {self._schema} CASCADE"), autocommit=True)

    # --- workers ---------------------------------------------------------------------------

    def claim(self, queue: str, worker_id: str, limit: int, lease_s: float,
              limits: ClaimLimits = NO_LIMITS) -> list[Job]:
        # Stamped with a token of its own, so a claim whose answer was lost while it committed
        # is read back rather than run again (session.py): its jobs would otherwise be held
        # until their lease ran out, an attempt spent, by a worker that never got them.
        token = uuid.uuid4()
        read_back = self._read_back(queue, worker_id, lease_s, token)
        key_limit = limits.key_limit
        if limits.rate_per_s is None and key_limit is not None:
            return self._session.run(lambda conn: self._claim_keyed(
                conn, queue, worker_id, limit, lease_s, key_limit, token),
                autocommit=True, read_back=read_back)
        if limits.any:
            return self._session.run(lambda conn: self._claim_limited(
                conn, queue, worker_id, limit, lease_s, limits, token), read_back=read_back)
        return self._session.run(lambda conn: self._jobs(
            conn, "claim", queue=queue, worker_id=_text(worker_id), limit=limit,
            lease_s=lease_s, token=token), autocommit=True, read_back=read_back)

    def claim_one(self, queue: str, job_id: str, worker_id: str, lease_s: float,
                  limits: ClaimLimits = NO_LIMITS) -> Job | None:
        token = uuid.uuid4()
        read_back = self._read_back(queue, worker_id, lease_s, token)
        if limits.any:
            jobs = self._session.run(lambda conn: self._claim_limited(
                conn, queue, worker_id, 1, lease_s, limits, token, job_id),
                read_back=read_back)
        else:
            # Pipelined with a lock_timeout: it waits for the job's row lock (no SKIP LOCKED)
            jobs = self._session.run(lambda conn: self._pipelined_claim(
                conn, "claim_one", {"queue": queue, "id": job_id,
                                    "worker_id": _text(worker_id), "lease_s": lease_s,
                                    "key_limit": None, "token": token}),
                autocommit=True, read_back=read_back)
        return jobs[0] if jobs else None

    def _read_back(self, queue: str, worker_id: str, lease_s: float, token: uuid.UUID
                   ) -> Callable[[psycopg.Connection], list[Job] | None]:
        """What a claim stamped with ``token`` took and still holds, its leases renewed for
        ``lease_s`` (the retry may come a while later); None when it holds none. A lease that
        ran out meanwhile is not handed out: another worker may be claiming that job."""
        def read(conn: psycopg.Connection) -> list[Job] | None:
            return self._jobs(conn, "claimed_by_token", queue=queue, token=token,
                              worker_id=_text(worker_id), lease_s=lease_s) or None
        return read

    def heartbeat_many(self, queue: str, leases: Sequence[Lease], lease_s: float) -> list[str]:
        if not leases:
            return []
        _, rows = self._session.run(lambda conn: self._tuples(
            conn, "heartbeat", queue=queue, ids=[lease.job_id for lease in leases],
            epochs=[lease.lease_epoch for lease in leases],
            holders=[lease.worker_id for lease in leases],
            tokens=[_fence(lease.claim_token) for lease in leases], lease_s=lease_s,
            lease_lost=LEASE_LOST),
            idempotent=True, autocommit=True)
        held = {(job_id, epoch): _token(token) for job_id, epoch, token in rows}
        return [lease.job_id for lease in leases if not lease.beaten(held)]

    def _finish(self, queue: str, lease: Lease, name: str, then: Sequence[FollowUp] = (),
                **params: Any) -> Job:
        """Run one fenced finish; follow-ups only when the job really finished. Without
        follow-ups it is one autocommitted statement."""
        def work(conn: psycopg.Connection) -> tuple[Job, bool]:
            cols, rows = self._tuples(conn, name, queue=queue, id=lease.job_id,
                                      lease_epoch=lease.lease_epoch, worker_id=lease.worker_id,
                                      claim_token=_fence(lease.claim_token),
                                      stale_reason=STALE_REASON, **params)
            if not rows:
                raise LeaseLost(queue, lease.job_id, lease.lease_epoch)
            job = _jobs(cols, rows)[0]
            if rows[0][cols["was_stale"]]:
                return job, True  # given back for its new revision: ready again at once
            for follow in then:
                self._enqueue(conn, follow.queue, follow.specs, "keep")
            return job, job.status == "pending" and not params.get("delay_s")
        if then:
            return self._session.run(lambda conn: self._notify_if(conn, queue, *work(conn)))
        return self._session.run(lambda conn: self._wake_after(conn, queue, *work(conn)),
                                 autocommit=True)

    def _notify_if(self, conn: psycopg.Connection, queue: str, job: T, wake: bool) -> T:
        if wake:
            self._notify(conn, queue)
        return job

    def _wake_after(self, conn: psycopg.Connection, queue: str, job: T, wake: bool) -> T:
        """NOTIFY after an autocommitted finish. The finish has committed and a wake-up is
        only a hint (workers also poll), so failing to send it must not fail the finish."""
        if wake:
            with suppress(psycopg.Error):
                self._notify(conn, queue)
        return job

    def complete(self, queue: str, lease: Lease, result_json: str | None, status: str = "done",
                 result_key: str | None = None, then: Sequence[FollowUp] = ()) -> Job:
        # One item of the batch statement: complete and complete_many fence alike by design.
        return self._finish(queue, lease, "complete_many", then, ids=[lease.job_id],
                            epochs=[lease.lease_epoch], holders=[lease.worker_id],
                            tokens=[_fence(lease.claim_token)], statuses=[status],
                            results=[result_json],
                            result_keys=[result_key])

    def complete_many(self, queue: str, items: Sequence[Completion]) -> list[Job | LeaseLost]:
        if not items:
            return []
        def work(conn: psycopg.Connection) -> dict[str, Job]:
            cols, rows = self._tuples(
                conn, "complete_many", queue=queue,
                ids=[c.lease.job_id for c in items],
                epochs=[c.lease.lease_epoch for c in items],
                holders=[c.lease.worker_id for c in items],
                tokens=[_fence(c.lease.claim_token) for c in items],
                statuses=[c.status for c in items], results=[c.result_json for c in items],
                result_keys=[c.result_key for c in items], stale_reason=STALE_REASON)
            stale = cols.get("was_stale", -1)
            finished = {job.id: job for job in _jobs(cols, rows)}
            return self._wake_after(conn, queue, finished, any(r[stale] for r in rows))
        finished = self._session.run(work, autocommit=True)
        # By the whole lease, not the id: a batch may hold a lost lease and the current one of
        # the same job, and only the current one finished (a finish keeps epoch and token).
        return [job if (job := finished.get(c.lease.job_id)) is not None and c.lease.names(job)
                else LeaseLost(queue, c.lease.job_id, c.lease.lease_epoch) for c in items]

    def retry_later(self, queue: str, lease: Lease, error: str, reason: str,
                    delay_s: float) -> Job:
        return self._finish(queue, lease, "retry_later", error=_text(error),
                            reason=_text(reason), delay_s=delay_s,
                            data=json.dumps({"delay_s": delay_s}),
                            quarantined=_text(quarantine_reason(Failure.EXHAUSTED, reason)))

    def snooze(self, queue: str, lease: Lease, delay_s: float, reason: str = "snoozed",
               max_snoozes: int = 200) -> Job:
        return self._finish(queue, lease, "snooze", delay_s=delay_s, reason=_text(reason),
                            max_snoozes=max_snoozes, snoozed_out=SNOOZED_OUT,
                            exhausted_prefix=_EXHAUSTED_PREFIX)

    def give_back(self, queue: str, lease: Lease, started: bool, reason: str,
                  max_givebacks: int = 3) -> Job:
        return self._finish(queue, lease, "give_back", started=bool(started),
                            reason=_text(reason), max_givebacks=max_givebacks,
                            given_back_out=GIVEN_BACK_OUT, exhausted_prefix=_EXHAUSTED_PREFIX)

    def fail(self, queue: str, lease: Lease, error: str, reason: str, failure: str) -> Job:
        return self._finish(queue, lease, "fail", error=_text(error), failure=failure,
                            quarantined=_text(quarantine_reason(failure, reason)))

    # --- upkeep ----------------------------------------------------------------------------

    def reclaim_expired(self, queue: str) -> tuple[int, int]:
        def work(conn: psycopg.Connection) -> tuple[int, int]:
            failed = self._count(conn, "expire_spent", queue=queue,
                                 lease_expired_on=LEASE_EXPIRED_ON, held_by=HELD_BY)
            returned = self._count(conn, "return_expired", queue=queue)
            failed += self._count(conn, "exhaust_pending", queue=queue,
                                  spent_while_pending=SPENT_WHILE_PENDING_ERROR)
            if returned:
                self._notify(conn, queue)
            return failed, returned
        return self._session.run(work)

    def purge(self, queue: str, older_than_s: Mapping[str, float]) -> int:
        deleted = 0
        for status, age in older_than_s.items():
            found = PURGE_BATCH
            while found == PURGE_BATCH:
                gone, found = self._purge_batch(queue, status, float(age))
                deleted += gone
        return deleted

    def _purge_batch(self, queue: str, status: str, age_s: float) -> tuple[int, int]:
        """Up to ``PURGE_BATCH`` jobs and their journal, in a statement of their own: how
        many it deleted, and how many it found (safe to retry: a batch that landed leaves
        those jobs gone, and the next finds others)."""
        (row,) = self._session.run(lambda conn: self._rows(
            conn, "purge", queue=queue, status=status, age_s=age_s, batch=PURGE_BATCH),
            idempotent=True, autocommit=True)
        return int(row["n"]), int(row["found"])

    # --- operators -------------------------------------------------------------------------

    def requeue(self, queue: str, job_id: str) -> bool:
        return self._operator(queue, job_id, "operator_requeue")

    def cancel(self, queue: str, job_id: str) -> bool:
        return self._operator(queue, job_id, "operator_cancel")

    def _operator(self, queue: str, job_id: str, name: str) -> bool:
        def work(conn: psycopg.Connection) -> bool:
            if self._count(conn, name, queue=queue, id=job_id):
                if name == "operator_requeue":
                    self._notify(conn, queue)
                return True
            if not self._rows(conn, "exists", queue=queue, id=job_id):
                raise JobNotFound(queue, job_id)
            return False
        return self._session.run(work)

    # --- broker outbox --------------------------------------------------------------------

    def prepare_outbox(self, stop: Event | None = None) -> None:
        """Build ``jobs_outbox`` when it is missing or INVALID (see ``outbox_index``).

        On a connection of its own, outside the session: the build (seconds per million jobs,
        after a wait for the transactions older than it) may run longer than
        ``call_timeout_s`` lets a call, and a build cut short is only thrown away."""
        lock_key = f"leaseq.outbox_index.{self.options.schema}"
        try:
            with psycopg.connect(self._conninfo, autocommit=True) as conn:
                ensure_outbox_index(conn, self.queries, lock_key, stop)
        except OutboxIndexStopped:
            pass  # logged where it stopped; the next start builds it
        except psycopg.OperationalError as exc:
            if not _connection_lost(exc):
                raise
            raise StoreUnavailable(f"PostgreSQL at {self.url} is unavailable: "
                                   f"{self._session.error_line(exc)}") from None

    def republish(self, queue: str, published_before_s: float) -> int:
        # Safe to retry: clearing the mark twice only owes the same publish.
        return self._session.run(lambda conn: self._count(
            conn, "republish", queue=queue, published_before_s=published_before_s),
            idempotent=True, autocommit=True)

    def mark_published(self, queue: str, leases: Sequence[Lease],
                       as_of: datetime | None = None) -> list[str]:
        if not leases:
            return []
        rows = self._session.run(lambda conn: self._rows(
            conn, "mark_published", queue=queue, ids=[lease.job_id for lease in leases],
            epochs=[lease.lease_epoch for lease in leases], as_of=as_of),
            idempotent=True, autocommit=True)
        return [r["id"] for r in rows]

    # --- journal ---------------------------------------------------------------------------

    def append_journal(self, queue: str, job_id: str, event: str, *,
                       attempt: int | None = None, lease_epoch: int | None = None,
                       worker_id: str | None = None, reason: str | None = None,
                       data: Mapping[str, Any] | None = None) -> None:
        self._session.run(lambda conn: self._exec(
            conn, "append_journal", queue=queue, id=job_id, event=event, attempt=attempt,
            lease_epoch=lease_epoch, worker_id=_text(worker_id), reason=_text(reason),
            data=json.dumps(dict(data)) if data else None), autocommit=True)

    # --- wake-ups --------------------------------------------------------------------------

    def wait_for_work(self, queues: Sequence[str], timeout_s: float) -> bool:
        """Wait on this process's enqueues and on other processes' NOTIFYs (one LISTEN
        connection per store, opened by the first wait). Falls back to a plain timed wait
        while the LISTEN connection is down."""
        started = time.monotonic()
        self._listener.watch(queues, ready_timeout_s=timeout_s)
        left = max(timeout_s - (time.monotonic() - started), 0.0)
        return super().wait_for_work(queues, left)

    # --- broker outbox: a message dead-lettered unsettled ---------------------------------

    def reowe_publish(self, queue: str, job_ids: Sequence[str],
                      reason: str = Store.REOWE_REASON) -> list[str]:
        if not job_ids:
            return []
        # Safe to retry: a commit that went through left nothing published among these ids.
        rows = self._session.run(lambda conn: self._rows(
            conn, "reowe_publish", queue=queue, ids=list(job_ids), event=JournalEvent.PUBLISH_OWED,
            reason=_text(reason)), idempotent=True, autocommit=True)
        return [r["id"] for r in rows]



    # --- asyncio callers (stores/postgres/aio.py) and waiting for a finish -----------------

    async def aenqueue_many(self, queue: str, specs: Sequence[JobSpec],
                            on_conflict: OnConflict = "raise", connection: Any = None
                            ) -> list[EnqueueResult]:
        """Native async; ``connection=``: the caller's ``psycopg.AsyncConnection``."""
        _check_text(specs)
        return await self._async.enqueue_many(queue, specs, on_conflict, connection)

    async def aget(self, queue: str, job_id: str) -> Job | None:
        return await self._async.get(queue, job_id)

    async def acounts(self, queue: str) -> dict[str, int]:
        return await self._async.counts(queue)

    async def ajournal(self, queue: str, job_id: str) -> list[JournalEntry]:
        return await self._async.journal(queue, job_id)

    async def arequeue(self, queue: str, job_id: str) -> bool:
        return await self._async.operator(queue, job_id, "operator_requeue")

    async def acancel(self, queue: str, job_id: str) -> bool:
        return await self._async.operator(queue, job_id, "operator_cancel")

    async def aclose(self) -> None:
        await self._async.close()

    def watch_finish(self, queue: str, job_id: str) -> NotifyWatch:
        """Woken by the finish's NOTIFY (migration 008) on this store's LISTEN connection,
        listening to the finish channel (up to 2 s; then the watch's fallback poll covers)
        before this returns."""
        watch = NotifyWatch(self._listener.finishes, finish_key(queue, job_id))
        self._listener.listen_finishes(ready_timeout_s=2.0)
        return watch

    def _open_session(self, conninfo: str, url: str, options: PostgresOptions) -> Sessions:
        """Where this store's transactions run: its own pool (a subclass may borrow a
        framework's connection instead, as ``django://`` does)."""
        return Session(conninfo, url, options)


def _connection_lost(exc: psycopg.OperationalError) -> bool:
    """No connection, or the server went away (class 08, or a shutdown: 57P01-57P03); an
    error the server reported on a live connection (a deadlock, a cancel) is not that."""
    return exc.sqlstate is None or exc.sqlstate.startswith(("08", "57P"))


def _dt(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


def _token(value: uuid.UUID | None) -> str | None:
    return None if value is None else str(value)


#: What a lease's token that is no UUID is sent as: the nil UUID, which no claim stamps
#: (tokens are random UUIDs), so the fence finds no such claim and the write is LeaseLost.
_NO_CLAIM = str(uuid.UUID(int=0))


def _fence(token: str | None) -> str | None:
    """A lease's ``claim_token`` as the uuid column takes it: a token that is no UUID (a lease
    made by hand, or another store's) holds no claim here, and must fence the write out as
    any other stranger's does, not fail the cast with the driver's own error."""
    if token is None:
        return None
    try:
        return str(uuid.UUID(token))
    except (ValueError, TypeError, AttributeError):
        return _NO_CLAIM


#: Job's fields in the order of its constructor.
_FIELDS = tuple(f.name for f in dataclasses.fields(Job) if f.name != "lease_lost")
#: How a column is read into its field when not as it comes: the timestamps, and the claim's
#: token (a uuid column, a string in ``Lease``).
_READERS: dict[str, Callable[[Any], Any]] = {
    **dict.fromkeys(("lease_until", "created_at", "updated_at", "first_seen_at",
                     "published_at"), _dt), "claim_token": _token}


def _jobs(cols: dict[str, int], rows: list[tuple[Any, ...]]) -> list[Job]:
    """Jobs from tuple rows, the column positions looked up once per batch, not per row."""
    if not rows:
        return []
    at = [(cols[f], _READERS.get(f)) for f in _FIELDS]
    # Positional, in Job's field order.
    return [Job(*[read(row[i]) if read else row[i] for i, read in at])
            for row in rows]

