"""SQLite store: WAL, a busy timeout, every write under ``BEGIN IMMEDIATE``.

Safe for many threads (one connection, one lock) and for several processes on one host (each
process opens its own connection; ``BEGIN IMMEDIATE`` takes the database's write lock before
the first read, so the read-decide-write of enqueue and of every fenced finish is atomic).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from leaseq.errors import InvalidInput, InvalidURL, JobNotFound, LeaseqError, StoreUnavailable
from leaseq.job import (
    Completion,
    Failure,
    FollowUp,
    Job,
    Lease,
    LeaseLost,
    given_back_too_often,
    snoozed_too_often,
)
from leaseq.journal import (
    EXPIRED,
    HELD_BY,
    LEASE_EXPIRED,
    LEASE_EXPIRED_ON,
    LEASE_LOST,
    OPERATOR,
    SPENT_WHILE_PENDING,
    SPENT_WHILE_PENDING_ERROR,
    STALE_REASON,
    JournalEvent,
    quarantine_reason,
)
from leaseq.limits import NO_LIMITS, ClaimLimits, FrontFirst
from leaseq.stores.base import PURGE_BATCH, Store, require_schema
from leaseq.stores.sqlbase import SQLStore
from leaseq.stores.sqlite import schema
from leaseq.stores.sqlite.checkpoint import BACKSTOP_PAGES, Checkpointer
from leaseq.stores.sqlite.enqueue import SQLiteEnqueue
from leaseq.stores.sqlite.ledger import ScheduleLedger
from leaseq.stores.sqlite.limited import LimitedClaims
from leaseq.stores.sqlite.named import Q
from leaseq.stores.sqlite.operators import SQLiteOperatorTools
from leaseq.stores.sqlite.waits import StoreLock, busy_within_deadline
from leaseq.stores.watch import ChangeCounterWatch, FinishWatch
from leaseq.validate import redact_url

#: How often an idle worker looks for commits by other processes. Defaults to 2 ms: a
#: ``PRAGMA data_version`` read costs microseconds and takes no lock.
WAKEUP_POLL_S = 0.002
#: The longest busy_timeout_ms SQLite takes (a C int); a longer one became 0: no wait at all.
MAX_BUSY_TIMEOUT_MS = 2**31 - 1
#: How far above a stamp read back from the store (``Job.updated_at``, to the microsecond) a
#: stored stamp may be and still be that one: the column holds the float it was read from.
STAMP_SLACK_S = 1e-5


def _busy_timeout_range(value: object) -> str:
    return (f"busy_timeout_ms must be a whole number of milliseconds from 0 to "
            f"{MAX_BUSY_TIMEOUT_MS} (about 24 days), got {value!r}")


def url_path(path: str) -> str:
    """``path`` as a sqlite:/// URL writes it: only what ``from_url`` would read otherwise
    (``%``, ``#``, ``?``) percent-encoded, so the URL opens the same file and still reads as
    the path it names."""
    return path.replace("%", "%25").replace("#", "%23").replace("?", "%3F")


class SQLiteStore(SQLiteEnqueue, SQLiteOperatorTools, ScheduleLedger, LimitedClaims,
                  SQLStore):
    #: The thread that checkpoints the WAL of a database file (checkpoint.py); None in memory.
    _checkpoints: Checkpointer | None = None

    supports_create_false = True

    def __init__(self, path: str, busy_timeout_ms: int = 30_000, time_offset_s: float = 0.0,
                 create: bool = True):
        if (isinstance(busy_timeout_ms, bool) or not isinstance(busy_timeout_ms, int)
                or not 0 <= busy_timeout_ms <= MAX_BUSY_TIMEOUT_MS):
            raise InvalidInput(_busy_timeout_range(busy_timeout_ms))
        self._init_state(path, f"sqlite:///{url_path(path)}", time_offset_s, StoreLock(path))
        try:
            self._conn = self._open(path, busy_timeout_ms, create)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open SQLite database {path!r}: {exc}") from None
        if create:
            try:
                self.migrate()
            except sqlite3.Error as exc:  # e.g. another writer held the lock past the timeout
                self._conn.close()
                raise StoreUnavailable(
                    f"cannot migrate SQLite database {path!r}: {exc}") from None
        if path != ":memory:":
            self._checkpoints = Checkpointer(path)

    def _init_state(self, path: str, url: str, time_offset_s: float,
                    lock: AbstractContextManager[Any]) -> None:
        """Everything a SQLite store keeps besides its connection: the one place it is set,
        so a store that borrows its connection (``DjangoSQLiteStore``) cannot miss any."""
        self.path = path
        self.url = url
        self.time_offset_s = time_offset_s
        self._lock = lock
        self._front_first = FrontFirst()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SQLiteStore:
        parts = urlsplit(url)
        if parts.netloc or not parts.path.startswith("/") or len(parts.path) < 2:
            raise InvalidURL(
                f"SQLite URLs look like sqlite:///relative/jobs.db, sqlite:////abs/jobs.db or "
                f"sqlite:///:memory:; got {redact_url(url)}"
            )
        if parts.fragment or url.endswith("#"):
            raise InvalidURL(f"a SQLite URL has no #fragment; a file name with # or ? in it "
                             f"is written %23 or %3F: got {redact_url(url)}")
        try:
            query = dict(parse_qsl(parts.query, strict_parsing=bool(parts.query)))
        except ValueError:
            raise InvalidURL(f"SQLite URL options are name=value pairs joined by &; a file "
                             f"name with ? in it is written %3F: got {redact_url(url)}") from None
        unknown = set(query) - {"busy_timeout_ms"}
        if unknown:
            raise InvalidURL(f"unknown SQLite URL option(s) {', '.join(sorted(unknown))}; "
                             "known: busy_timeout_ms")
        if "busy_timeout_ms" in query:
            try:
                busy_timeout_ms = int(query["busy_timeout_ms"])
            except ValueError:
                raise InvalidURL("busy_timeout_ms must be a whole number") from None
            if not 0 <= busy_timeout_ms <= MAX_BUSY_TIMEOUT_MS:
                raise InvalidURL(_busy_timeout_range(busy_timeout_ms))
            options.setdefault("busy_timeout_ms", busy_timeout_ms)
        return cls(unquote(parts.path[1:]), **options)

    def _open(self, path: str, busy_timeout_ms: int, create: bool) -> sqlite3.Connection:
        if not create:
            conn = self._open_existing(path, busy_timeout_ms)
        else:
            if path != ":memory:":
                folder = os.path.dirname(os.path.abspath(path))
                if not os.path.isdir(folder):
                    raise sqlite3.OperationalError(f"folder {folder!r} does not exist")
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                                   timeout=busy_timeout_ms / 1000)
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        if path != ":memory:":
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}")
        # NORMAL is durable across process crashes in WAL mode (only an OS crash or power
        # loss may roll back the last transactions); FULL costs an fsync per commit.
        conn.execute("PRAGMA synchronous = NORMAL")
        return conn

    def _open_existing(self, path: str, busy_timeout_ms: int) -> sqlite3.Connection:
        """``create=False``: the file must exist (``mode=rw`` never makes one) and hold
        leaseq's schema, checked before the pragmas: WAL mode would rewrite the header of a
        file that is not leaseq's. A new ``:memory:`` database never holds it."""
        if path == ":memory:" or not os.path.isfile(path):
            require_schema(self.url, None, schema.LATEST)
        conn = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=rw", uri=True,
                               isolation_level=None, check_same_thread=False,
                               timeout=busy_timeout_ms / 1000)
        try:
            require_schema(self.url, schema.version(conn), schema.LATEST)
        except BaseException:
            conn.close()
            raise
        return conn

    # --- plumbing ---------------------------------------------------------------------------

    def _params(self, **params: Any) -> dict[str, Any]:
        params["off"] = self.time_offset_s
        return params

    @contextmanager
    def _tx(self, connection: sqlite3.Connection | None = None) -> Iterator[sqlite3.Connection]:
        """A write transaction, or the caller's own (``connection=``) under a savepoint: an
        error undoes only what this call wrote, and the caller's transaction goes on. Its
        waits for the locks end at the caller's deadline (waits.py)."""
        if connection is not None:
            with _savepoint(connection):
                yield connection
            return
        with self._lock:
            conn = self._conn
            try:
                with busy_within_deadline(conn):
                    conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if _busy(exc):
                    raise StoreUnavailable(
                        f"SQLite database {self.path!r} is busy: {exc}") from None
                raise StoreUnavailable(f"SQLite database {self.path!r} refused a write "
                                       f"transaction: {exc}") from None
            try:
                with self._store_errors():
                    yield conn
            except BaseException:
                if conn.in_transaction:  # a full disk or an I/O error may have ended it
                    conn.execute("ROLLBACK")
                raise
            self._commit(conn)

    @contextmanager
    def _store_errors(self) -> Iterator[None]:
        """sqlite3's refusals as leaseq's errors (``store_error``): the worker, the CLI and
        callers handle those, and a raw ``sqlite3.OperationalError`` crashed the first."""
        try:
            yield
        except sqlite3.Error as exc:
            error = store_error(exc, f"SQLite database {self.path!r}")
            if error is None:
                raise
            raise error from None

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The connection for reads, under the store's lock, its refusals leaseq's errors."""
        with self._lock, self._store_errors():
            yield self._conn

    def _commit(self, conn: sqlite3.Connection) -> None:
        """COMMIT; one SQLite refuses (a full disk, an I/O error) is rolled back, so the
        connection is not left inside the transaction, refusing every later BEGIN."""
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise StoreUnavailable(
                f"SQLite database {self.path!r} could not commit: {exc}") from None

    def _rows(self, conn: sqlite3.Connection, name: str, **params: Any) -> list[dict[str, Any]]:
        cursor = conn.execute(Q[name], self._params(**params))
        columns = [c[0] for c in cursor.description] if cursor.description else []
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]

    def _read(self, name: str, **params: Any) -> list[dict[str, Any]]:
        with self._reading() as conn:
            return self._rows(conn, name, **params)

    @staticmethod
    def _time(value: Any) -> datetime | None:
        return None if value is None else datetime.fromtimestamp(value, UTC)

    @staticmethod
    def _stamp(value: Any) -> datetime:
        return datetime.fromtimestamp(value, UTC)

    @staticmethod
    def _json(value: Any) -> Any:
        return None if value is None else json.loads(value)

    def _journal(self, conn: sqlite3.Connection, queue: str, job_id: str, event: str,
                 attempt: int | None = None, lease_epoch: int | None = None,
                 worker_id: str | None = None, reason: str | None = None,
                 data: Mapping[str, Any] | None = None) -> None:
        conn.execute(Q["append_journal"], self._params(
            queue=queue, id=job_id, event=event, attempt=attempt, lease_epoch=lease_epoch,
            worker_id=worker_id, reason=reason, data=json.dumps(data) if data else None))

    # --- set-up -----------------------------------------------------------------------------

    def migrate(self) -> int:
        with self._lock:
            return schema.migrate(self._conn)

    def schema_version(self) -> int | None:
        with self._lock:
            return schema.version(self._conn)

    def close(self) -> None:
        if self._checkpoints is not None:
            self._checkpoints.stop()
        with self._lock:
            self._conn.close()

    def drop(self) -> None:
        with self._lock:
            self._conn.executescript(
                "DROP TABLE IF EXISTS leaseq_jobs; DROP TABLE IF EXISTS leaseq_journal; "
                "DROP TABLE IF EXISTS leaseq_schema; DROP TABLE IF EXISTS leaseq_limits; "
                "DROP TABLE IF EXISTS leaseq_schedules; DROP TABLE IF EXISTS leaseq_workers;")

    # --- workers ---------------------------------------------------------------------------

    def claim(self, queue: str, worker_id: str, limit: int, lease_s: float,
              limits: ClaimLimits = NO_LIMITS) -> list[Job]:
        with self._tx() as conn:
            if limits.any:
                rows = self._claim_limited(conn, queue, worker_id, limit, lease_s, limits)
            else:
                rows = self._rows(conn, "claim", queue=queue, worker_id=worker_id,
                                  lease_s=lease_s, limit=limit)
            self._journal_claims(conn, queue, rows)
        return sorted((_job(r) for r in rows), key=lambda j: (j.lease_until, j.id))

    def claim_one(self, queue: str, job_id: str, worker_id: str, lease_s: float,
                  limits: ClaimLimits = NO_LIMITS) -> Job | None:
        with self._tx() as conn:
            if limits.any:
                rows = self._claim_limited(conn, queue, worker_id, 1, lease_s, limits, job_id)
            else:
                rows = self._rows(conn, "claim_one", queue=queue, id=job_id,
                                  worker_id=worker_id, lease_s=lease_s)
            self._journal_claims(conn, queue, rows)
        return _job(rows[0]) if rows else None

    def _journal_claims(self, conn: sqlite3.Connection, queue: str,
                        rows: list[dict[str, Any]]) -> None:
        # From the epoch, not the attempts: a snooze or a give-back refunds the attempt, but
        # the claim after it is still a redelivery (journal_claims in queries/read.sql).
        if rows:
            conn.execute(Q["journal_claims"], self._params(
                queue=queue, ids=json.dumps([r["id"] for r in rows])))

    def _journal_rows(self, conn: sqlite3.Connection, queue: str, rows: Iterable[dict[str, Any]],
                      event: str, reason: Callable[[dict[str, Any]], str | None]) -> None:
        """One event for each row a statement returned (``id``, ``attempts``, ``lease_epoch``,
        ``worker_id``), in one ``executemany``."""
        conn.executemany(Q["append_journal"], [self._params(
            queue=queue, id=r["id"], event=event, attempt=r["attempts"],
            lease_epoch=r["lease_epoch"], worker_id=r.get("worker_id"), reason=reason(r),
            data=None) for r in rows])

    def heartbeat_many(self, queue: str, leases: Sequence[Lease], lease_s: float) -> list[str]:
        fences = json.dumps([[lease.job_id, lease.lease_epoch, lease.worker_id,
                              lease.claim_token] for lease in leases])
        with self._tx() as conn:
            held = {(r["id"], r["lease_epoch"]): r["claim_token"] for r in self._rows(
                conn, "heartbeat", queue=queue, leases=fences, lease_s=lease_s)}
            lost = [lease for lease in leases if not lease.beaten(held)]
            conn.executemany(Q["journal_heartbeat_lost"], [self._params(
                queue=queue, id=lease.job_id, lease_epoch=lease.lease_epoch,
                lease_lost=LEASE_LOST) for lease in lost])
        return [lease.job_id for lease in lost]

    def _fenced(self, conn: sqlite3.Connection, queue: str, lease: Lease) -> dict[str, Any]:
        rows = self._rows(conn, "fenced_row", queue=queue, **_fence(lease))
        if not rows:
            raise LeaseLost(queue, lease.job_id, lease.lease_epoch)
        return rows[0]

    def _finish(self, conn: sqlite3.Connection, queue: str, lease: Lease, query: str,
                **params: Any) -> dict[str, Any]:
        rows = self._rows(conn, query, queue=queue, **_fence(lease), **params)
        if not rows:  # _fenced checked under the same write lock; this is belt and braces
            raise LeaseLost(queue, lease.job_id, lease.lease_epoch)
        return rows[0]

    def _restart_stale(self, conn: sqlite3.Connection, queue: str, lease: Lease) -> Job:
        """A stale job's finish: given back, the new revision to start afresh."""
        row = self._finish(conn, queue, lease, "restart_revision")
        self._journal(conn, queue, lease.job_id, JournalEvent.GIVEN_BACK, row["attempts"],
                      lease.lease_epoch, row["worker_id"], STALE_REASON)
        return _job(row)

    def complete(self, queue: str, lease: Lease, result_json: str | None, status: str = "done",
                 result_key: str | None = None, then: Sequence[FollowUp] = ()) -> Job:
        with self._tx() as conn:
            if self._fenced(conn, queue, lease)["stale"]:
                return self._restart_stale(conn, queue, lease)
            row = self._finish(conn, queue, lease, "complete", status=status,
                               result=result_json, result_key=result_key)
            self._journal(conn, queue, lease.job_id, JournalEvent.RESULT_SAVED, row["attempts"],
                          lease.lease_epoch, row["worker_id"], status)
            for follow in then:
                self._enqueue(conn, follow.queue, follow.specs, "keep")
        return _job(row)

    def complete_many(self, queue: str, items: Sequence[Completion]) -> list[Job | LeaseLost]:
        payload = json.dumps([[c.lease.job_id, c.lease.lease_epoch, c.status, c.result_json,
                               c.result_key, c.lease.worker_id, c.lease.claim_token]
                              for c in items])
        with self._tx() as conn:
            done = {r["id"]: r for r in self._rows(conn, "complete_many", queue=queue,
                                                   items=payload)}
            if done:
                conn.execute(Q["journal_results"], self._params(
                    queue=queue, ids=json.dumps(list(done))))
            return [self._settle(conn, queue, c.lease, done) for c in items]

    def _settle(self, conn: sqlite3.Connection, queue: str, lease: Lease,
                done: dict[str, dict[str, Any]]) -> Job | LeaseLost:
        """An item of complete_many: done, or a stale job's give-back, or LeaseLost."""
        row = done.get(lease.job_id)
        if row is not None and lease.names(job := _job(row)):
            return job
        try:
            self._fenced(conn, queue, lease)  # still held here means stale
            return self._restart_stale(conn, queue, lease)
        except LeaseLost as exc:
            return exc

    def retry_later(self, queue: str, lease: Lease, error: str, reason: str,
                    delay_s: float) -> Job:
        with self._tx() as conn:
            fenced = self._fenced(conn, queue, lease)
            if fenced["stale"]:
                return self._restart_stale(conn, queue, lease)
            if fenced["attempts"] >= fenced["max_attempts"]:
                return self._fail_in(conn, queue, lease, error, reason, Failure.EXHAUSTED)
            row = self._finish(conn, queue, lease, "retry_later", error=error, delay_s=delay_s)
            self._journal(conn, queue, lease.job_id, JournalEvent.RETRY_SCHEDULED, row["attempts"],
                          lease.lease_epoch, row["worker_id"], reason, {"delay_s": delay_s})
        return _job(row)

    def snooze(self, queue: str, lease: Lease, delay_s: float, reason: str = "snoozed",
               max_snoozes: int = 200) -> Job:
        with self._tx() as conn:
            fenced = self._fenced(conn, queue, lease)
            if fenced["stale"]:
                return self._restart_stale(conn, queue, lease)
            snoozes = fenced["snoozes"] + 1
            if snoozes > max_snoozes:
                error = snoozed_too_often(snoozes)
                row = self._finish(conn, queue, lease, "snoozed_out", error=error)
                self._journal(conn, queue, lease.job_id, JournalEvent.QUARANTINED,
                              row["attempts"], lease.lease_epoch, row["worker_id"],
                              quarantine_reason(Failure.EXHAUSTED, error))
                return _job(row)
            row = self._finish(conn, queue, lease, "snooze", delay_s=delay_s)
            self._journal(conn, queue, lease.job_id, JournalEvent.SNOOZED, row["attempts"],
                          lease.lease_epoch, row["worker_id"], reason)
        return _job(row)

    def give_back(self, queue: str, lease: Lease, started: bool, reason: str,
                  max_givebacks: int = 3) -> Job:
        with self._tx() as conn:
            fenced = self._fenced(conn, queue, lease)
            if fenced["stale"]:
                return self._restart_stale(conn, queue, lease)
            free = not started or fenced["givebacks"] < max_givebacks
            if not free and fenced["attempts"] >= fenced["max_attempts"]:
                error = given_back_too_often(fenced["givebacks"])
                return self._fail_in(conn, queue, lease, error, error, Failure.EXHAUSTED)
            row = self._finish(conn, queue, lease, "give_back", refund=int(free),
                               counted=int(started and free))
            self._journal(conn, queue, lease.job_id, JournalEvent.GIVEN_BACK, row["attempts"],
                          lease.lease_epoch, row["worker_id"], reason)
        return _job(row)

    def fail(self, queue: str, lease: Lease, error: str, reason: str, failure: str) -> Job:
        with self._tx() as conn:
            if self._fenced(conn, queue, lease)["stale"]:
                return self._restart_stale(conn, queue, lease)
            return self._fail_in(conn, queue, lease, error, reason, failure)

    def _fail_in(self, conn: sqlite3.Connection, queue: str, lease: Lease, error: str,
                 reason: str, failure: str) -> Job:
        row = self._finish(conn, queue, lease, "fail", error=error, failure=failure)
        self._journal(conn, queue, lease.job_id, JournalEvent.QUARANTINED, row["attempts"],
                      lease.lease_epoch, row["worker_id"], quarantine_reason(failure, reason))
        return _job(row)

    # --- upkeep ----------------------------------------------------------------------------

    def reclaim_expired(self, queue: str) -> tuple[int, int]:
        with self._tx() as conn:
            spent = self._rows(conn, "expire_spent", queue=queue,
                               lease_expired_on=LEASE_EXPIRED_ON, held_by=HELD_BY)
            returned = self._rows(conn, "return_expired", queue=queue)
            stuck = self._rows(conn, "exhaust_pending", queue=queue,
                               spent_while_pending=SPENT_WHILE_PENDING_ERROR)
            self._journal_rows(conn, queue, spent, JournalEvent.QUARANTINED, lambda _: EXPIRED)
            self._journal_rows(conn, queue, returned, JournalEvent.RECLAIMED,
                               lambda _: LEASE_EXPIRED)
            self._journal_rows(conn, queue, stuck, JournalEvent.QUARANTINED,
                               lambda _: SPENT_WHILE_PENDING)
        return len(spent) + len(stuck), len(returned)

    def purge(self, queue: str, older_than_s: Mapping[str, float]) -> int:
        deleted = 0
        for status, age in older_than_s.items():
            while (gone := self._purge_batch(queue, status, age)) == PURGE_BATCH:
                deleted += gone
            deleted += gone
        return deleted

    def _purge_batch(self, queue: str, status: str, age: float) -> int:
        """Up to ``PURGE_BATCH`` jobs and their journal, in a transaction of their own (the
        write lock is let go between batches, for every other writer of the database)."""
        with self._tx() as conn:
            params = self._params(queue=queue, status=status, older_than_s=age,
                                  batch=PURGE_BATCH)
            ids = [row[0] for row in conn.execute(Q["purge_jobs"], params).fetchall()]
            if ids:
                conn.execute(Q["purge_journal"], {"queue": queue, "ids": json.dumps(ids)})
        return len(ids)

    # --- operators -------------------------------------------------------------------------

    def requeue(self, queue: str, job_id: str) -> bool:
        return self._operator(queue, job_id, "operator_requeue", JournalEvent.REQUEUED)

    def cancel(self, queue: str, job_id: str) -> bool:
        return self._operator(queue, job_id, "operator_cancel", JournalEvent.CANCELLED)

    def _operator(self, queue: str, job_id: str, query: str, event: str) -> bool:
        with self._tx() as conn:
            rows = self._rows(conn, query, queue=queue, id=job_id)
            if not rows:
                if not self._rows(conn, "exists", queue=queue, id=job_id):
                    raise JobNotFound(queue, job_id)
                return False
            self._journal(conn, queue, job_id, event, rows[0]["attempts"],
                          rows[0]["lease_epoch"], reason=OPERATOR)
        return True

    # --- wake-ups -------------------------------------------------------------------------

    def wait_for_work(self, queues: Sequence[str], timeout_s: float) -> bool:
        """Wake on an enqueue in this process at once, and on another process's commit that
        left a job ready within ``WAKEUP_POLL_S``. A commit that readied nothing (another
        worker's heartbeat or completion) is checked with a lock-free read and slept through,
        so idle workers don't contend for the write lock."""
        event = self._wakeup_event()
        deadline = time.monotonic() + timeout_s
        seen = self._data_version()
        # A commit between the caller's empty claim and the read above would go unseen.
        if self._any_ready(queues):
            return True
        while (remaining := deadline - time.monotonic()) > 0:
            if event.wait(min(remaining, WAKEUP_POLL_S)):
                event.clear()
                return True
            version = self._data_version()
            if version != seen:
                seen = version
                if self._any_ready(queues):
                    return True
        return False

    def _any_ready(self, queues: Sequence[str]) -> bool:
        return any(self._read("any_ready", queue=q) for q in queues)

    def _data_version(self) -> int:
        with self._reading() as conn:
            return int(conn.execute("PRAGMA data_version").fetchone()[0])

    # --- broker outbox --------------------------------------------------------------------

    def republish(self, queue: str, published_before_s: float) -> int:
        with self._tx() as conn:
            return conn.execute(Q["republish"], self._params(
                queue=queue, published_before_s=published_before_s)).rowcount

    def mark_published(self, queue: str, leases: Sequence[Lease],
                       as_of: datetime | None = None) -> list[str]:
        pairs = json.dumps([[lease.job_id, lease.lease_epoch] for lease in leases])
        with self._tx() as conn:
            rows = self._rows(conn, "mark_published", queue=queue, leases=pairs,
                              as_of=None if as_of is None else as_of.timestamp() + STAMP_SLACK_S)
            self._journal_rows(conn, queue, rows, JournalEvent.PUBLISHED, lambda _: None)
        return [r["id"] for r in rows]

    # --- journal ---------------------------------------------------------------------------

    def append_journal(self, queue: str, job_id: str, event: str, *,
                       attempt: int | None = None, lease_epoch: int | None = None,
                       worker_id: str | None = None, reason: str | None = None,
                       data: Mapping[str, Any] | None = None) -> None:
        with self._tx() as conn:
            self._journal(conn, queue, job_id, event, attempt, lease_epoch, worker_id, reason,
                          data)

    # --- broker outbox: a message dead-lettered unsettled ---------------------------------

    def reowe_publish(self, queue: str, job_ids: Sequence[str],
                      reason: str = Store.REOWE_REASON) -> list[str]:
        if not job_ids:
            return []
        with self._tx() as conn:
            rows = self._rows(conn, "reowe_publish", queue=queue, ids=json.dumps(list(job_ids)))
            self._journal_rows(conn, queue, rows, JournalEvent.PUBLISH_OWED, lambda _: reason)
        return [r["id"] for r in rows]

    # --- waiting for a finish --------------------------------------------------------------

    def watch_finish(self, queue: str, job_id: str) -> FinishWatch:
        """Woken by the database's change counter, read on a connection of the watch's own
        (so this process's commits count too); an in-memory database, which no second
        connection can see, is polled."""
        if self.path == ":memory:":
            return FinishWatch()
        return ChangeCounterWatch(self.path)


#: The write paths map the rows their statements return as the reads do.
_job = SQLiteStore._job


def _fence(lease: Lease) -> dict[str, Any]:
    """The named parameters every fenced statement takes (queries/finish.sql)."""
    return {"id": lease.job_id, "lease_epoch": lease.lease_epoch,
            "worker_id": lease.worker_id, "claim_token": lease.claim_token}


@contextmanager
def _savepoint(conn: sqlite3.Connection) -> Iterator[None]:
    """Within the caller's transaction. One in autocommit mode with none open is refused, as on
    PostgreSQL: a savepoint there would commit on its own, outside anything the caller decides.
    In the sqlite3 module's default mode the transaction is opened here, taking the write lock
    first (``BEGIN IMMEDIATE``, or the connection's ``EXCLUSIVE``): a deferred one reads first,
    and another process's commit in between would refuse its write at once. A caller's own
    transaction that read first can still be refused so: that is ``StoreUnavailable``."""
    if not conn.in_transaction:
        # Python 3.12's autocommit=True leaves isolation_level as it was ("" by default)
        if conn.isolation_level is None or getattr(conn, "autocommit", None) is True:
            raise InvalidInput("connection= is in autocommit mode with no open transaction: "
                               "open one first (connection.execute('BEGIN IMMEDIATE'))")
        exclusive = conn.isolation_level.upper() == "EXCLUSIVE"
        try:
            conn.execute("BEGIN EXCLUSIVE" if exclusive else "BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"SQLite database is busy: {exc}") from None
    conn.execute("SAVEPOINT leaseq_enqueue")
    try:
        yield
    except BaseException as exc:
        conn.execute("ROLLBACK TO leaseq_enqueue")
        conn.execute("RELEASE leaseq_enqueue")
        if _busy(exc):
            raise StoreUnavailable(
                f"SQLite database is busy: {exc} (a transaction that read before this enqueue "
                "cannot write once another has: open it with BEGIN IMMEDIATE)") from None
        error = store_error(exc, "the SQLite database of connection=")
        if error is None:
            raise
        raise error from None
    conn.execute("RELEASE leaseq_enqueue")


def store_error(exc: BaseException, what: str) -> LeaseqError | None:
    """The leaseq error a sqlite3 error inside a transaction stands for, or None (not
    sqlite3's, or a programming error: a constraint, a closed connection, bad SQL). A value
    SQLite cannot hold ("string or blob too big") is ``InvalidInput``; a database that
    refused (a full disk, an I/O error, a read-only file, a lock held past the busy timeout, a
    damaged file) is ``StoreUnavailable``. Either way nothing of the transaction was written."""
    if isinstance(exc, sqlite3.DataError):
        return InvalidInput(f"{what} cannot hold a value: {exc}; nothing was written")
    if isinstance(exc, sqlite3.IntegrityError | sqlite3.ProgrammingError
                  | sqlite3.NotSupportedError) or not isinstance(exc, sqlite3.DatabaseError):
        return None
    return StoreUnavailable(f"{what} refused the statement: {exc}; nothing was written")


def _busy(exc: BaseException) -> bool:
    """SQLite refused for another connection's lock (SQLITE_BUSY, SQLITE_LOCKED, any of their
    extended codes such as BUSY_SNAPSHOT)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.OperationalError) and code is not None and (
        code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED))
