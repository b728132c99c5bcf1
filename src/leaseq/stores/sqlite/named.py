"""The SQLite store's named queries (``queries/*.sql``), with its clock filled in."""

from __future__ import annotations

from leaseq.journal import sql_literals
from leaseq.stores.sql import load_queries

# Unix seconds with millisecond resolution from SQLite's clock, plus the test-only offset.
NOW = "((julianday('now') - 2440587.5) * 86400.0 + :off)"

# A claim's token (leaseq.job.Lease): 128 random bits, new for every job a claim takes.
CLAIM_TOKEN = "lower(hex(randomblob(16)))"

Q = load_queries(__package__, "queries", now=NOW, claim_token=CLAIM_TOKEN, **sql_literals())
