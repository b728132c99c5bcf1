"""``django://ALIAS`` on PostgreSQL: the PostgreSQL store with its transactions on Django's
connection (see ``leaseq.contrib.django.store`` for what that means for the caller)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

import psycopg
from django.db import connections, transaction
from psycopg.conninfo import make_conninfo
from psycopg.pq import Conninfo

from leaseq.contrib.django.store import (
    NO_CONNECTION,
    aenqueue_on_django_thread,
    enqueue_in_savepoint,
    in_atomic,
    raw_connection,
    unavailable,
)
from leaseq.errors import InvalidURL
from leaseq.job import EnqueueResult, JobSpec, OnConflict
from leaseq.stores.postgres import PostgresStore
from leaseq.stores.postgres.options import LIBPQ_DEFAULTS, PostgresOptions, parse_url
from leaseq.stores.postgres.session import (
    beyond_limit,
    error_line,
    over_a_limit,
    refused_by_the_store,
    store_refused,
)

T = TypeVar("T")


def alias_conninfo(alias: str) -> str:
    """The conninfo of leaseq's own connections for ``alias`` (LISTEN, the async pool, a
    migration inside ``atomic()``): every libpq keyword of Django's connection parameters
    (Django's and psycopg's own, such as ``cursor_factory`` or ``prepare_threshold``, are
    none), leaseq's ``LIBPQ_DEFAULTS`` where the alias sets nothing."""
    params = connections[alias].get_connection_params()
    keywords = libpq_keywords()
    given = {k: str(v) for k, v in params.items() if k in keywords and v not in (None, "")}
    return make_conninfo(**{**LIBPQ_DEFAULTS, **given})


def libpq_keywords() -> frozenset[str]:
    """Every connection keyword the installed libpq knows."""
    return frozenset(option.keyword.decode() for option in Conninfo.get_defaults())


class DjangoSession:
    """``Session``'s interface on Django's connection: ``run(work)`` is ``work(conn)`` in
    a savepoint of the caller's ``atomic()``, or in a transaction of its own. One statement
    outside ``atomic()`` runs in autocommit (Django's default). A lost connection is not
    retried (Django reconnects on the next call): it raises ``StoreUnavailable``."""

    def __init__(self, alias: str, conninfo: str):
        self.alias = alias
        self.url = f"django://{alias}"
        self._conninfo = conninfo

    def first_use(self, work: Callable[[psycopg.Connection], object]) -> None:
        """The migration (or the schema check): inside the caller's ``atomic()`` on a
        connection of leaseq's own, committed at once; in a savepoint it would hold the
        migration's advisory lock, and every other process's first use, until the caller's
        transaction ends."""
        if not in_atomic(self.alias):
            self.run(work)
            return
        try:
            with psycopg.connect(self._conninfo) as conn:  # commits at the end of the block
                work(conn)
        except psycopg.OperationalError as exc:
            raise unavailable(self.alias, exc) from None

    def close(self) -> None:
        """Nothing to close: the connections are Django's."""

    def run(self, work: Callable[[psycopg.Connection], T], *, idempotent: bool = False,
            autocommit: bool = False, generic_plans: bool = False,
            read_back: Callable[[psycopg.Connection], T | None] | None = None) -> T:
        """``read_back`` is not needed: nothing is run twice here; ``generic_plans`` is
        ignored: the connection and its plans are Django's."""
        try:
            if autocommit and not in_atomic(self.alias):
                return work(raw_connection(self.alias))
            with transaction.atomic(using=self.alias):  # connects, or commits: Django's errors
                return work(raw_connection(self.alias))
        except (psycopg.OperationalError, *NO_CONNECTION) as exc:
            if over_a_limit(exc):
                raise beyond_limit(self.url, self.error_line(exc)) from None
            self._drop_if_broken()
            raise unavailable(self.alias, exc) from None
        except psycopg.Error as exc:
            if refused_by_the_store(exc):
                raise store_refused(self.url, self.error_line(exc)) from None
            raise

    def error_line(self, exc: BaseException) -> str:
        """``Session.error_line``: the first line of a driver error, the alias's password
        masked (the async calls and the outbox index report errors with it)."""
        return error_line(exc, connections[self.alias].settings_dict.get("PASSWORD"))

    def _drop_if_broken(self) -> None:
        wrapper = connections[self.alias]
        raw = wrapper.connection
        if raw is not None and (raw.broken or raw.closed) and not wrapper.in_atomic_block:
            wrapper.close()  # the next call opens a fresh one


class DjangoPostgresStore(PostgresStore):
    """The PostgreSQL store on Django's connection for ``alias``."""

    alias: str

    @classmethod
    def for_alias(cls, alias: str, query: str = "", options: Mapping[str, Any] | None = None,
                  create: bool = True) -> DjangoPostgresStore:
        """``query``: a ``django://`` URL's (URL-encoded), with leaseq's options of a
        ``postgresql://`` URL (``schema``, ``pool_max``, …); ``options``: as for
        ``PostgresStore.from_url``. The connection settings are the alias's: a libpq
        keyword, or any other key, raises ``InvalidURL``."""
        rest, parsed = parse_url(f"postgresql:///?{query}", **(options or {}))
        # parse_url hands every key that is not leaseq's on to libpq (in ``rest``), which
        # here never sees it
        unknown = sorted({key for key, _ in parse_qsl(query, keep_blank_values=True)}
                         & {key for key, _ in parse_qsl(urlsplit(rest).query)})
        if unknown:
            known = sorted(f.name for f in fields(PostgresOptions) if f.name != "time_offset_s")
            raise InvalidURL(f"django://{alias}: unknown option(s) {', '.join(unknown)}; "
                             f"known: {', '.join(known)} (the connection's settings are the "
                             "alias's, in settings.DATABASES)")
        return cls(alias, alias_conninfo(alias), parsed, create)

    def __init__(self, alias: str, conninfo: str, options: PostgresOptions,
                 create: bool = True):
        self.alias = alias  # before the base's __init__, which opens the session
        super().__init__(conninfo, options, f"django://{alias}", create)

    def _open_session(self, conninfo: str, url: str, options: PostgresOptions) -> DjangoSession:
        return DjangoSession(self.alias, conninfo)

    def enqueue_many(self, queue: str, specs: Sequence[JobSpec],
                     on_conflict: OnConflict = "raise", connection: Any = None
                     ) -> list[EnqueueResult]:
        if connection is not None:
            return super().enqueue_many(queue, specs, on_conflict, connection)
        return enqueue_in_savepoint(self, self.alias, queue, lambda raw: super(
            DjangoPostgresStore, self).enqueue_many(queue, specs, on_conflict, raw))

    async def aenqueue_many(self, queue: str, specs: Sequence[JobSpec],
                            on_conflict: OnConflict = "raise", connection: Any = None
                            ) -> list[EnqueueResult]:
        """With ``connection=`` (a ``psycopg.AsyncConnection``): native async, in that
        connection's transaction. Without: on Django's thread, on Django's connection."""
        if connection is not None:
            return await super().aenqueue_many(queue, specs, on_conflict, connection)
        return await aenqueue_on_django_thread(self, queue, specs, on_conflict)
