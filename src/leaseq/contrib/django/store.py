"""``django://ALIAS``: a store that borrows Django's own database connection for that alias.

Every store call runs on the calling thread's Django connection (Django keeps one per
thread), so inside ``transaction.atomic()`` an enqueue is part of the caller's transaction:
it commits or rolls back with the business rows. Each enqueue runs in a savepoint of its own
(a nested ``atomic``), so a ``JobConflict`` undoes only the enqueue and leaves the caller's
transaction usable. Outside ``atomic()`` each call is its own short transaction, as with
Django's autocommit.

Wake-ups: on PostgreSQL the enqueue's ``pg_notify`` is part of the transaction, so the
server delivers it when the caller commits (never for a rollback); on SQLite idle workers see
the commit through the change counter. Either way ``transaction.on_commit`` also wakes this
process's own workers.

The PostgreSQL store keeps a connection of its own for LISTEN and a pool for the async API
(``aenqueue`` and friends with no ``connection=``), both opened from the alias's settings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar
from urllib.parse import urlsplit

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections, transaction

from leaseq.errors import InvalidInput, InvalidURL, StoreUnavailable
from leaseq.job import EnqueueResult, JobSpec, OnConflict
from leaseq.stores.base import Store, require_schema
from leaseq.stores.sqlite import SQLiteStore, schema
from leaseq.stores.watch import FinishWatch

T = TypeVar("T")


def parse_django_url(url: str) -> tuple[str, str]:
    """``django://ALIAS?option=value`` → (alias, its query, still URL-encoded). ``django://``
    means ``default``."""
    parts = urlsplit(url)
    if parts.scheme != "django" or parts.path not in ("", "/"):
        raise InvalidURL(f"a Django store URL looks like django://default; got {url[:200]!r}")
    alias = parts.netloc or DEFAULT_DB_ALIAS
    try:
        configured = connections.settings
    except ImproperlyConfigured:
        raise InvalidURL("django:// needs Django's settings: run under manage.py, or set "
                         "DJANGO_SETTINGS_MODULE and call django.setup() first") from None
    if alias not in configured:
        known = ", ".join(sorted(configured)) or "none"
        raise InvalidURL(f"django://{alias}: no such database alias in settings.DATABASES "
                         f"(known: {known})")
    return alias, parts.query


class DjangoStore(Store):
    """The ``django://`` scheme: ``from_url`` opens the borrowing store for the alias's
    vendor (``DjangoPostgresStore`` or ``DjangoSQLiteStore``). With ``create=False`` leaseq's
    tables are checked, not made (Django's own connection may still make a SQLite file)."""

    supports_create_false = True

    @classmethod
    def from_url(  # type: ignore[override]  # the vendor's store, not a DjangoStore
            cls, url: str, **options: Any) -> Store:
        create = options.pop("create", True)
        alias, query = parse_django_url(url)
        vendor = connections[alias].vendor
        if vendor == "postgresql":
            from leaseq.contrib.django.postgres import DjangoPostgresStore

            return DjangoPostgresStore.for_alias(alias, query, options, create)
        if vendor == "sqlite":
            if query or options:
                raise InvalidURL(f"django://{alias} on SQLite takes no options")
            return DjangoSQLiteStore(alias, create)
        raise InvalidURL(f"django://{alias} is a {vendor} database; leaseq borrows Django's "
                         "connection on PostgreSQL and SQLite")


# --- borrowing Django's connection -----------------------------------------------------------


#: Django's errors for a connection it could not open or has lost (the driver's, wrapped):
#: to leaseq the store is unavailable, as with the driver's own errors.
NO_CONNECTION = (OperationalError, InterfaceError)


@contextmanager
def unavailable_without_connection(alias: str) -> Iterator[None]:
    """Raise ``StoreUnavailable`` for Django's "no connection" errors: Django (re)connects
    lazily, in ``ensure_connection`` or on entering ``atomic()``, and a worker's claim round
    goes on after a ``LeaseqError`` only."""
    try:
        yield
    except NO_CONNECTION as exc:
        raise unavailable(alias, exc) from None


def raw_connection(alias: str) -> Any:
    """The DB-API connection under this thread's Django connection for ``alias``."""
    wrapper = connections[alias]
    with unavailable_without_connection(alias):
        wrapper.ensure_connection()
    return wrapper.connection


def in_atomic(alias: str) -> bool:
    return bool(connections[alias].in_atomic_block)


def enqueue_in_savepoint(store: Store, alias: str, queue: str,
                         write: Callable[[Any], list[EnqueueResult]]) -> list[EnqueueResult]:
    """Run ``write(raw_connection)`` in a savepoint of the caller's ``atomic()`` (or in a
    transaction of its own), and wake this process's workers once it commits."""
    with unavailable_without_connection(alias), transaction.atomic(using=alias):
        results = write(raw_connection(alias))
        transaction.on_commit(lambda: store.notify_local(queue), using=alias)
    return results


async def aenqueue_on_django_thread(store: Store, queue: str, specs: Sequence[JobSpec],
                                    on_conflict: OnConflict) -> list[EnqueueResult]:
    """``aenqueue`` on a ``django://`` store: on Django's sync thread (as Django's own async
    ORM calls), where the caller's ``sync_to_async(thread_sensitive=True)`` work runs."""
    return await sync_to_async(store.enqueue_many, thread_sensitive=True)(
        queue, specs, on_conflict, None)


# --- SQLite ----------------------------------------------------------------------------------


class DjangoSQLiteStore(SQLiteStore):
    """The SQLite store on Django's connection for ``alias``.

    Outside ``atomic()`` each write is its own ``BEGIN IMMEDIATE`` transaction, as in the
    plain SQLite store. Inside, the write joins Django's transaction, which Django opens
    with a plain (deferred) ``BEGIN`` unless the alias sets ``OPTIONS["transaction_mode"] =
    "IMMEDIATE"``: set it when several processes write (Django's own advice for SQLite).
    """

    # no super().__init__: Django owns the connection; _init_state sets everything else
    def __init__(self, alias: str, create: bool = True):
        self.alias = alias
        # One connection per thread (Django's), so nothing to serialise in this process; a
        # shared lock would even deadlock a thread waiting on SQLite's write lock with one
        # holding it inside atomic().
        self._init_state(str(connections[alias].settings_dict["NAME"]), f"django://{alias}",
                         0.0, nullcontext())
        if not create or in_atomic(alias):
            # Inside atomic() (a request under ATOMIC_REQUESTS, a TestCase) it cannot migrate:
            # its BEGIN IMMEDIATE would end the caller's transaction. An older schema is said
            # at once (StoreNotMigrated: run manage.py leaseq_migrate), not met by a claim.
            require_schema(self.url, self.schema_version(), schema.LATEST)
        else:
            self.migrate()

    @property
    def _conn(self) -> Any:  # type: ignore[override]  # the base's one connection: this thread's
        return raw_connection(self.alias)

    @contextmanager
    def _tx(self, connection: Any = None) -> Iterator[Any]:
        if connection is not None:
            yield connection
        elif in_atomic(self.alias):
            with transaction.atomic(using=self.alias):
                yield raw_connection(self.alias)
        else:
            with super()._tx() as conn:
                yield conn

    def enqueue_many(self, queue: str, specs: Sequence[JobSpec],
                     on_conflict: OnConflict = "raise", connection: Any = None
                     ) -> list[EnqueueResult]:
        if connection is not None or not in_atomic(self.alias):
            return super().enqueue_many(queue, specs, on_conflict, connection)
        return enqueue_in_savepoint(self, self.alias, queue, lambda raw: super(
            DjangoSQLiteStore, self).enqueue_many(queue, specs, on_conflict, raw))

    async def aenqueue_many(self, queue: str, specs: Sequence[JobSpec],
                            on_conflict: OnConflict = "raise", connection: Any = None
                            ) -> list[EnqueueResult]:
        if connection is not None:
            raise InvalidInput("aenqueue on a django:// store takes no connection=: call "
                               "enqueue inside sync_to_async(thread_sensitive=True) instead")
        return await aenqueue_on_django_thread(self, queue, specs, on_conflict)

    async def _in_thread(self, call: Callable[..., T], *args: Any) -> T:
        return await sync_to_async(call, thread_sensitive=True)(*args)

    def migrate(self) -> int:
        if in_atomic(self.alias):
            raise InvalidInput("leaseq's SQLite migration runs its own transactions: call it "
                               "outside transaction.atomic()")
        return super().migrate()

    def close(self) -> None:
        """Nothing to close: the connections are Django's."""

    def watch_finish(self, queue: str, job_id: str) -> FinishWatch:
        if connections[self.alias].is_in_memory_db():
            return FinishWatch()
        return super().watch_finish(queue, job_id)


def unavailable(alias: str, exc: BaseException) -> StoreUnavailable:
    """``StoreUnavailable`` with the first line of ``exc``, the alias's password masked."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    password = connections[alias].settings_dict.get("PASSWORD")
    if password:
        first = first.replace(password, "***")
    return StoreUnavailable(f"django://{alias} is unavailable: {first[:300]}")
