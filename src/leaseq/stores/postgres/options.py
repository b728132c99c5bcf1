"""The PostgreSQL store's options: leaseq's own, read from the URL, the rest left to libpq."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from leaseq.errors import InvalidInput, InvalidURL
from leaseq.redact import ENCODE_HINT, refuse_ambiguous_userinfo
from leaseq.validate import redact_url

# A lower-case identifier short enough that the NOTIFY channel "leaseq_<schema>" stays within
# PostgreSQL's 63-byte limit for names.
_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,55}")

#: libpq options leaseq sets when the URL does not: a dead host fails in seconds, not minutes,
#: and the sessions are easy to find in pg_stat_activity. Over TCP, a black-holed connection
#: (packets dropped, no reset) is found too: ``tcp_user_timeout`` (ms) ends a connection whose
#: sent data stays unacknowledged that long, and keepalives probe one that waits for an answer
#: (5 s idle, then 3 probes 2 s apart). libpq ignores all four on a Unix socket.
LIBPQ_DEFAULTS = {"connect_timeout": "10", "application_name": "leaseq",
                  "keepalives": "1", "keepalives_idle": "5", "keepalives_interval": "2",
                  "keepalives_count": "3", "tcp_user_timeout": "10000"}

#: The longest ``idle_in_transaction_s``: PostgreSQL keeps the timeout in milliseconds in a
#: 32-bit int, and refuses a longer one on every new connection.
MAX_IDLE_IN_TRANSACTION_S = (2**31 - 1) / 1000


@dataclass(frozen=True, slots=True)
class PostgresOptions:
    """leaseq's options of one PostgreSQL store. Validated when built; unknown keys raise."""

    schema: str = "leaseq"
    """Schema that holds the tables; created on first use. Defaults to ``leaseq``."""
    pool_min: int = 1
    """Connections the pool keeps open. Defaults to 1."""
    pool_max: int = 10
    """Most connections the pool opens. Defaults to 10."""
    reconnect_s: float = 15.0
    """How long an operation keeps retrying a lost connection before ``StoreUnavailable``.
    Defaults to 15 s."""
    call_timeout_s: float = 30.0
    """Longest one try of a call (a statement, or a transaction with its COMMIT) may wait on
    the network and the server; then leaseq cuts the connection itself (a client-side
    deadline: a server that never got the query cannot time it out) and the try counts as a
    lost connection. A caller's shorter deadline (``leaseq.deadline.within``, the heartbeat's
    bound) wins. Defaults to 30 s."""
    idle_in_transaction_s: float = 60.0
    """The server ends a session left idle inside a transaction this long (a client cut off
    mid-transaction must not hold its row locks); at most ``MAX_IDLE_IN_TRANSACTION_S``.
    Defaults to 60 s."""
    time_offset_s: float = 0.0
    """Test-only: seconds added to the server's clock. Defaults to 0."""

    def __post_init__(self) -> None:
        if not isinstance(self.schema, str) or not _SCHEMA_RE.fullmatch(self.schema):
            raise InvalidInput(
                f"schema {str(self.schema)[:80]!r} is not allowed: use 1-56 characters of "
                "lower-case letters, digits and '_', not starting with a digit"
            )
        if self.schema.startswith("pg_"):
            raise InvalidInput(f"schema {self.schema!r}: names starting with pg_ are reserved")
        _check_int(self.pool_min, "pool_min", 0)
        _check_int(self.pool_max, "pool_max", 1)
        if self.pool_min > self.pool_max:
            raise InvalidInput(f"pool_min ({self.pool_min}) exceeds pool_max ({self.pool_max})")
        for name in ("reconnect_s", "call_timeout_s", "idle_in_transaction_s",
                     "time_offset_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidInput(f"{name} must be a number of seconds")
        if not math.isfinite(self.reconnect_s) or self.reconnect_s < 0:
            raise InvalidInput(f"reconnect_s must be a finite number ≥ 0, got {self.reconnect_s!r}")
        for name in ("call_timeout_s", "idle_in_transaction_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise InvalidInput(f"{name} must be a finite number > 0, got {value!r}")
        if self.idle_in_transaction_s > MAX_IDLE_IN_TRANSACTION_S:
            raise InvalidInput(
                f"idle_in_transaction_s must be at most {MAX_IDLE_IN_TRANSACTION_S:.3f} "
                f"(PostgreSQL's limit, about 24 days), got {self.idle_in_transaction_s!r}")

    @property
    def channel(self) -> str:
        """The NOTIFY channel of this schema's enqueues."""
        return f"leaseq_{self.schema}"

    @property
    def finish_channel(self) -> str:
        """The NOTIFY channel of this schema's finishes (migration 008; ≤ 63 bytes)."""
        return f"lqdone_{self.schema}"


def parse_url(url: str, **overrides: Any) -> tuple[str, PostgresOptions]:
    """Split a ``postgresql://`` URL into libpq's connection string and leaseq's options.

    Raises ``InvalidURL`` (password masked) for a malformed URL or a bad leaseq option.
    """
    shown = redact_url(url)
    refuse_ambiguous_userinfo(url, "PostgreSQL")
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:  # its message may quote a piece of the password: not shown
        raise InvalidURL(f"cannot parse PostgreSQL URL {shown}; {ENCODE_HINT}") from None
    if parts.scheme.lower() not in ("postgresql", "postgres"):
        raise InvalidURL(f"a PostgreSQL URL starts with postgresql://; got {shown}")
    known = {f.name for f in fields(PostgresOptions)} - {"time_offset_s"}
    ours = {k: v for k, v in query if k in known}
    unknown = sorted(set(overrides) - known - {"time_offset_s"})
    if unknown:
        raise InvalidInput(f"unknown PostgreSQL store option(s): {', '.join(unknown)}; "
                           f"known: {', '.join(sorted(known | {'time_offset_s'}))}")
    try:
        options = PostgresOptions(**{**_typed(ours), **overrides})
    except InvalidInput as exc:
        raise InvalidURL(f"{exc} (in {shown})") from None
    rest = [(k, v) for k, v in query if k not in known]
    rest += [(k, v) for k, v in LIBPQ_DEFAULTS.items() if k not in dict(rest)]
    # quote, not urlencode's default quote_plus: libpq reads a "+" in a URI as itself. Not
    # urlunsplit: with no host (postgresql:///db, the local socket) it drops the "//".
    query_text = urlencode(rest, quote_via=quote)
    conninfo = f"{parts.scheme}://{parts.netloc}{parts.path}?{query_text}"
    return conninfo, options


def _typed(raw: dict[str, str]) -> dict[str, Any]:
    typed: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            if key in ("pool_min", "pool_max"):
                typed[key] = int(value)
            elif key in ("reconnect_s", "call_timeout_s", "idle_in_transaction_s"):
                typed[key] = float(value)
            else:
                typed[key] = value
        except ValueError:
            raise InvalidURL(f"{key} must be a number, got {value[:40]!r}") from None
    return typed


def _check_int(value: Any, name: str, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 10_000:
        raise InvalidInput(f"{name} must be a whole number from {low} to 10000, got {value!r}")
