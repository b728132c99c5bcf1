"""The PostgreSQL store: ``postgresql://user:pass@host:5432/db?schema=leaseq`` (psycopg 3)."""

from leaseq.stores.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
