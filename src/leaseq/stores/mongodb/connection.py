"""URL options, the client's settings, and pymongo's errors mapped to leaseq's."""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import unquote, unquote_plus, urlsplit, urlunsplit

import pymongo
from pymongo import MongoClient, uri_parser
from pymongo.errors import (
    BulkWriteError,
    ConfigurationError,
    ConnectionFailure,
    DocumentTooLarge,
    OperationFailure,
    PyMongoError,
)

from leaseq import deadline, validate
from leaseq.errors import (
    InvalidPayload,
    InvalidURL,
    StoreRefused,
    StoreUnavailable,
    UnsupportedOperation,
)
from leaseq.redact import ENCODE_HINT, SECRET_PARAMETERS, refuse_ambiguous_userinfo

#: MongoDB's error code for a transaction on a standalone server ("Transaction numbers are
#: only allowed on a replica set member or mongos").
NO_TRANSACTIONS = 20
#: MongoDB's limit on one document (``maxBsonObjectSize``): a job's document holds its
#: payload and its result.
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
#: The server's codes for a write whose document would outgrow ``MAX_DOCUMENT_BYTES``:
#: BSONObjectTooLarge, and the older "Resulting document after update is larger than" and
#: "Document to upsert is larger than".
_TOO_LARGE_CODES = frozenset({10334, 17419, 17420})
#: The server's refusals of the store itself to this user: Unauthorized (13, a role granted
#: too little) and AuthenticationFailed (18, a wrong user name or password).
_REFUSAL_CODES = frozenset({13, 18})
_PREFIX_RE = re.compile(r"[A-Za-z0-9_.-]{0,64}")
_OURS = ("prefix", "ttl")

#: Bounds leaseq gives pymongo when the URL does not set them, so that no call waits without
#: one on a partitioned or black-holed network: the store's opening finds a server within 10 s
#: (``serverSelectionTimeoutMS``: ``opening_bound``), a socket read waits 30 s at most
#: (``socketTimeoutMS``), and a whole operation, its retries and its wait for a server
#: included, ends within 30 s (``timeoutMS``). A caller's
#: shorter ``leaseq.deadline`` (the heartbeat's bound) wins over ``timeoutMS``.
TIMEOUT_DEFAULTS_MS = {"serverSelectionTimeoutMS": 10_000, "socketTimeoutMS": 30_000,
                       "timeoutMS": 30_000}

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class MongoOptions:
    """What a ``mongodb://`` URL says beyond what pymongo reads itself."""

    mongo_url: str
    """The URL handed to ``MongoClient`` (leaseq's own options taken out)."""
    database: str = "leaseq"
    """From the URL's path. Defaults to ``leaseq``."""
    prefix: str = "leaseq_"
    """Collection name = prefix + queue; the journal is prefix + ``journal``.
    Defaults to ``leaseq_``."""
    ttl_s: Mapping[str, float] | None = None
    """Terminal status → seconds after ``updated_at`` at which MongoDB's TTL monitor deletes
    the job (``ttl=tombstone:2592000,done:86400``; ``ttl=`` empty: none). None when the URL
    has no ``ttl=``: the store then leaves leaseq's TTL indexes as other processes made them
    (a producer's URL must not undo its workers')."""
    client_options: Mapping[str, Any] = field(default_factory=dict)
    """Defaults leaseq adds when the URL does not set them: ``w=majority``,
    ``retryWrites=true``, the bounds of ``TIMEOUT_DEFAULTS_MS``, timezone-aware datetimes."""


def parse_url(url: str) -> MongoOptions:
    refuse_ambiguous_userinfo(url, "MongoDB")
    try:
        parts = urlsplit(url)
    except ValueError:  # its message may quote a piece of the password: not shown
        raise InvalidURL(f"cannot parse MongoDB URL {validate.redact_url(url)}; "
                         f"{ENCODE_HINT}") from None
    ours, rest = split_query(parts.query)
    database = unquote(parts.path.lstrip("/")) or "leaseq"
    if "/" in database or "." in database or " " in database:
        raise InvalidURL(f"MongoDB database name {database[:80]!r} is not allowed")
    prefix = ours.get("prefix", "leaseq_")
    if not _PREFIX_RE.fullmatch(prefix):
        raise InvalidURL("prefix= may hold up to 64 letters, digits, '_', '.' or '-'")
    given = {piece.partition("=")[0].lower() for piece in rest}  # as pymongo reads names
    client_options: dict[str, Any] = {"tz_aware": True}
    if "w" not in given:
        client_options["w"] = "majority"
    if "retrywrites" not in given:
        client_options["retryWrites"] = True
    for name, milliseconds in TIMEOUT_DEFAULTS_MS.items():
        if name.lower() not in given:
            client_options[name] = milliseconds
    return MongoOptions(
        mongo_url=urlunsplit(parts._replace(query="&".join(rest))),
        database=database, prefix=prefix, ttl_s=parse_ttl(ours["ttl"]) if "ttl" in ours else None,
        client_options=client_options,
    )


def split_query(query: str) -> tuple[dict[str, str], list[str]]:
    """leaseq's own options (decoded) and every other piece of the query exactly as written.

    The others are not decoded and encoded again: pymongo unquotes some values itself and
    others not (``readPreferenceTags=dc:ny,rack:r1`` re-encoded as ``dc%3Any%2Crack%3Ar1``
    lost its tags), so only the bytes the user wrote reach it. Empty pieces carry nothing."""
    ours: dict[str, str] = {}
    rest: list[str] = []
    for piece in filter(None, query.split("&")):
        name, _, value = piece.partition("=")
        if name in _OURS:
            ours[name] = unquote_plus(value)
        else:
            rest.append(piece)
    return ours, rest


def open_client(url: str) -> tuple[MongoOptions, MongoClient[Any]]:
    """The parsed options and a client (it connects lazily; SRV names resolve here)."""
    parsed = parse_url(url)
    try:
        # Strictly first: the client only warns of an option it cannot read (a misspelled
        # name, readPreference=nearestx, timeoutMS=-5) and then goes without it
        uri_parser.parse_uri(parsed.mongo_url, warn=False)
        return parsed, MongoClient(parsed.mongo_url, **parsed.client_options)
    # InvalidURI, SRV lookup failures, an option it cannot read; a bare ValueError for a port
    # out of range or not digits, or an option's value
    except (ConfigurationError, ValueError) as exc:
        text = mask(str(exc), secrets_of(url))
        raise InvalidURL(f"cannot use {validate.redact_url(url)}: {text[:300]}") from None


def async_opener(parsed: MongoOptions) -> Callable[[], tuple[Any, Callable[[], Any]]]:
    """Opens the async database of a URL on a new ``AsyncMongoClient`` (lazy: it connects on
    first use), with the blocking client's options."""
    def open_database() -> tuple[Any, Callable[[], Any]]:
        from pymongo import AsyncMongoClient

        client: Any = AsyncMongoClient(parsed.mongo_url, **parsed.client_options)
        return client[parsed.database], client.close

    return open_database


def parse_ttl(text: str) -> dict[str, float]:
    """``"tombstone:2592000,done:86400"`` → ``{"tombstone": 2592000.0, "done": 86400.0}``."""
    rules: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        status, sep, seconds = item.partition(":")
        try:
            value = float(seconds) if sep else -1.0
        except ValueError:
            value = -1.0
        if value < 1:
            raise InvalidURL(f"ttl= takes status:seconds pairs (seconds ≥ 1), got {item[:80]!r}")
        rules[check_ttl_status(status)] = value
    return rules


def check_ttl_status(status: str) -> str:
    try:
        return validate.terminal_status(status)
    except ValueError as exc:  # InvalidInput: a TTL on a live status would delete live jobs
        raise InvalidURL(f"ttl= status: {exc}") from None


class OffsetClock:
    """``_off``: the test-only offset that every query document adds to the server's $$NOW,
    read from ``time_offset_s`` at each call (a test moves it while the store is open)."""

    time_offset_s: float

    @property
    def _off(self) -> float:
        return self.time_offset_s


def guarded(method: F) -> F:
    """Map pymongo's errors to leaseq's (``translated``); run the call within the caller's
    ``leaseq.deadline`` when there is one (pymongo's own ``timeout``)."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return _within_callers_deadline(method, self, *args, **kwargs)
        except (DocumentTooLarge, PyMongoError) as exc:
            mapped = translated(self, exc)
            if mapped is None:
                raise
            raise mapped from None

    return wrapper  # type: ignore[return-value]  # functools.wraps keeps the signature


def translated(store: Any, exc: Exception) -> Exception | None:
    """pymongo's ``exc`` as leaseq's error, secrets masked, for the blocking calls
    (``guarded``) and the async reads (aio.py) alike; None when it passes through as it is.

    A document over MongoDB's size limit is ``InvalidPayload``, a transaction on a standalone
    server ``UnsupportedOperation``, a refused user ``StoreRefused``, and connection errors
    and timeouts (the server's maxTimeMS, or timeoutMS or the caller's deadline client-side)
    ``StoreUnavailable``."""
    if isinstance(exc, DocumentTooLarge):  # found by the driver, before anything was sent
        return too_large(type(exc).__name__)
    if isinstance(exc, OperationFailure):
        if document_too_large(exc):
            return too_large(type(exc).__name__)
        if exc.code == NO_TRANSACTIONS:
            return UnsupportedOperation(no_transactions_message(store.url))
        if exc.code in _REFUSAL_CODES:
            return refused(store, exc)
    if isinstance(exc, ConnectionFailure | ConfigurationError) or (
            isinstance(exc, PyMongoError) and exc.timeout):
        return unavailable(store, exc)
    return None


def opening_bound(client: Any) -> contextlib.AbstractContextManager[Any]:
    """The store's first call (it finds a server) within the client's
    ``serverSelectionTimeoutMS``: under a client-side operation timeout (``timeoutMS``, a
    default of leaseq's) pymongo looks for a server for as long as the operation may take and
    ignores ``serverSelectionTimeoutMS``, so an unreachable server was reported after 30 s
    rather than the 10 s (or the URL's own setting) the docs promise. A caller's shorter
    deadline still wins (pymongo keeps the nearer of nested timeouts)."""
    seconds = getattr(getattr(client, "options", None), "server_selection_timeout", None)
    if not isinstance(seconds, (int, float)) or seconds <= 0:
        return contextlib.nullcontext()
    return pymongo.timeout(seconds)


def _within_callers_deadline(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    remaining = deadline.remaining_s()
    if remaining is None:
        return method(*args, **kwargs)
    with pymongo.timeout(max(remaining, 0.001)):
        return method(*args, **kwargs)


def unavailable(store: Any, exc: PyMongoError) -> StoreUnavailable:
    """``exc`` (a connection error or a timeout) as ``StoreUnavailable``, secrets masked."""
    text = mask(f"{type(exc).__name__}: {exc}", store.secrets)
    return StoreUnavailable(f"MongoDB at {store.url} is unavailable: {text[:500]}. "
                            "Check the URL, the network and the server.")


def refused(store: Any, exc: OperationFailure) -> StoreRefused:
    """A refusal of the store to this user (``_REFUSAL_CODES``) as ``StoreRefused``, secrets
    masked: at once, since a retry would meet it again until the grants or the URL change."""
    text = mask(f"{type(exc).__name__}: {exc}", store.secrets)
    return StoreRefused(f"MongoDB at {store.url} refused leaseq's call: {text[:500]}; nothing "
                        "was written. Check the user name and password in the URL and the "
                        "user's roles on the database")


def document_too_large(exc: OperationFailure) -> bool:
    """Whether the server refused a write because its document would be over
    ``MAX_DOCUMENT_BYTES`` (as a command's error, or one of a bulk write's)."""
    if isinstance(exc, BulkWriteError):
        return any(error.get("code") in _TOO_LARGE_CODES
                   for error in (exc.details or {}).get("writeErrors", ()))
    return exc.code in _TOO_LARGE_CODES


def too_large(found_by: str) -> InvalidPayload:
    """A write whose job document would be over MongoDB's limit: a typed refusal (the write,
    or the transaction it was part of, did not happen). ``found_by`` says who found it (the
    driver's or server's error, or leaseq's check); the text names no value."""
    return InvalidPayload(
        f"the job's document would be over MongoDB's limit of {MAX_DOCUMENT_BYTES} bytes "
        f"({found_by}); nothing was written. Keep the payload and the result "
        "smaller (a large result can live elsewhere, named by result_key)")


def no_transactions_message(url: str) -> str:
    return (f"MongoDB at {url} is a standalone server: transactions need a replica set or "
            "mongos. Enqueue without connection= (each job is still written atomically), "
            "or run MongoDB as a replica set (a single-node one is enough).")


def mask(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def secrets_of(url: str) -> tuple[str, ...]:
    """The URL's password and its ``authMechanismProperties`` (an AWS session token), as
    written and decoded, to mask them in any error text."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ()
    userinfo = parts.netloc.rpartition("@")[0]
    written = [userinfo.split(":", 1)[1]] if ":" in userinfo else []
    for parameter in parts.query.split("&"):
        name, sep, value = parameter.partition("=")
        if sep and unquote(name).lower() in SECRET_PARAMETERS:
            written.append(value)
    return tuple(s for s in {*written, *map(unquote, written)} if s)
