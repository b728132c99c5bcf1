"""One RabbitMQ connection per process, opened from an ``amqp://`` URL, with the wake-up body
leaseq publishes. pika is imported here and only here, when a connection is opened."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from leaseq import validate
from leaseq.errors import (
    BrokerUnavailable,
    InvalidJobId,
    InvalidURL,
    LeaseqError,
    StoreUnavailable,
)
from leaseq.job import safe_reason
from leaseq.redact import ENCODE_HINT, Redact, redact, refuse_ambiguous_userinfo, traceback_text
from leaseq.validate import redact_url

if TYPE_CHECKING:
    from pika import BlockingConnection

log = logging.getLogger(__name__)

#: ``content_type`` of leaseq's messages; the body never carries the payload, only the id.
CONTENT_TYPE = "application/vnd.leaseq.job+json"


class Reconnect(Exception):
    """Raised in the connection's thread to drop the connection and open a new one, so that
    RabbitMQ returns every unsettled delivery (a handler thread met a store error)."""


def amqp_errors() -> tuple[type[BaseException], ...]:
    """Errors after which a fresh connection may succeed (broker restart, network)."""
    from pika.exceptions import AMQPError

    return (AMQPError, ConnectionError, OSError, Reconnect)


def is_fatal(exc: BaseException) -> bool:
    """Whether ``exc`` ends a reconnecting loop instead of starting a new session.

    Only leaseq's own refusals are fatal (``TopologyError``, a bad URL or config): a new
    connection would meet them again. A store outage is not, and nothing pika raises is
    either: on a connection that dropped, pika raises its own errors but also ``ValueError``
    ("Timeout closed before call"), ``AssertionError`` or ``AttributeError`` from a closed
    ioloop, depending on where the drop caught it. Nor is a broker that cannot be connected
    to: an operator may start it, create its vhost or fix the user while the loop waits."""
    return isinstance(exc, LeaseqError) and not isinstance(exc,
                                                           (StoreUnavailable, BrokerUnavailable))


#: Bounds every leaseq connection to RabbitMQ gets unless its URL sets them (pika reads
#: ``heartbeat``, ``blocked_connection_timeout``, ``socket_timeout`` and ``stack_timeout`` from
#: the URL's query). A partitioned or black-holed broker is noticed within two heartbeats (then
#: RabbitMQ, seeing the same silence, returns the unacknowledged deliveries); a broker that
#: blocks publishers (an alarm) closes the connection after ``blocked_connection_timeout``;
#: connecting (TCP, then the AMQP handshake) ends within ``socket_timeout`` / ``stack_timeout``.
CONNECTION_DEFAULTS: dict[str, float] = {"heartbeat": 15, "blocked_connection_timeout": 60.0,
                                         "socket_timeout": 10.0, "stack_timeout": 15.0}


def open_connection(amqp_url: str, *, name: str = "leaseq") -> BlockingConnection:
    """A blocking connection; ``InvalidURL`` (password masked) when the URL is unusable,
    ``BrokerUnavailable`` (password masked, and why) when RabbitMQ cannot be connected to."""
    import pika
    from pika.adapters.utils.connection_workflow import AMQPConnectorException

    params = connection_parameters(amqp_url, name=name)
    try:
        return pika.BlockingConnection(params)
    except (pika.exceptions.AMQPConnectionError, AMQPConnectorException, OSError) as exc:
        raise BrokerUnavailable(f"cannot connect to RabbitMQ at {redact_url(amqp_url)}: "
                                f"{connect_cause(exc)}") from None


def connect_cause(exc: BaseException) -> str:
    """Why a connect failed, in a few words: pika's own errors name neither the cause nor
    the address (a refused port is a bare ``AMQPConnectionError``), and quote the broker."""
    from pika.exceptions import AuthenticationError, ProbableAccessDeniedError
    from pika.exceptions import ProbableAuthenticationError as ProbableLogin

    if isinstance(exc, (AuthenticationError, ProbableLogin)):
        return "login refused"
    if isinstance(exc, ProbableAccessDeniedError):
        return "vhost not found" if "not found" in str(exc) else "access to the vhost refused"
    # A refused or timed-out socket: pika wraps the OSError in its connector's error.
    inner = getattr(exc.args[0], "exception", None) if exc.args else None
    if isinstance(inner, OSError):
        exc = inner
    if isinstance(exc, socket.gaierror):
        return "unknown host"
    if isinstance(exc, OSError):
        return (exc.strerror or type(exc).__name__).lower()
    return safe_reason(exc, 200)


def connection_parameters(amqp_url: str, *, name: str = "leaseq") -> Any:
    """pika's parameters for ``amqp_url`` with ``CONNECTION_DEFAULTS`` where the URL is silent;
    ``InvalidURL`` (password masked) when the URL is unusable."""
    import pika

    refuse_ambiguous_userinfo(amqp_url, "AMQP")
    try:
        params = pika.URLParameters(amqp_url)
    except Exception as exc:  # its message may quote a piece of the password: not shown
        raise InvalidURL(f"cannot use AMQP URL {redact_url(amqp_url)} ({type(exc).__name__}); "
                         f"{ENCODE_HINT}") from None
    given = {key.lower() for key, _ in parse_qsl(urlsplit(amqp_url).query)}
    for option, value in CONNECTION_DEFAULTS.items():
        if option not in given:
            setattr(params, option, value)
    params.client_properties = {"connection_name": name}
    return params


def broker_version(conn: BlockingConnection) -> tuple[int, ...]:
    """RabbitMQ's version as its handshake gave it (server property ``version``, bytes or
    str), as numbers: ``(3, 10, 8)``, ``(4, 0, 0)`` for ``4.0.0-rc.2``; ``()`` when it gave
    none leaseq can read. Read once per connection: a broker is upgraded only by restarting
    it, which ends the connection."""
    # pika keeps them on the connection the blocking one wraps: no public accessor, and its
    # stubs do not list ``_impl``.
    properties = getattr(getattr(conn, "_impl", None), "server_properties", None) or {}
    raw = properties.get("version")
    if isinstance(raw, bytes):
        raw = raw.decode(errors="replace")
    found = re.match(r"\d+(?:\.\d+)*", raw) if isinstance(raw, str) else None
    return tuple(int(part) for part in found.group().split(".")) if found else ()


@contextmanager
def session(amqp_url: str, name: str) -> Iterator[BlockingConnection]:
    """An open connection, closed on the way out whatever happened to it."""
    conn = open_connection(amqp_url, name=name)
    try:
        yield conn
    finally:
        try:
            if conn.is_open:
                conn.close()
        except Exception:  # a dropped connection may fail to close in any way
            pass


def reconnecting(run: Callable[[], None], stop: threading.Event, what: str,
                 max_backoff_s: float, redact: Redact = redact) -> None:
    """Call ``run`` until ``stop`` is set; after an error that is not ``is_fatal`` wait
    (0.5 s doubling up to ``max_backoff_s``) and call it again. Fatal errors are raised.
    ``redact`` masks the secrets of the errors it logs."""
    backoff = 0.5
    while not stop.is_set():
        try:
            run()
            backoff = 0.5
        except Exception as exc:
            if is_fatal(exc):
                raise
            _log_lost(what, exc, backoff, redact)
            stop.wait(backoff)
            backoff = min(backoff * 2, max_backoff_s)


def _log_lost(what: str, exc: Exception, backoff: float, redact: Redact) -> None:
    """One warning per lost session, the error redacted; its traceback (``traceback_text``,
    redacted too) only for what is not a known broker or store error (a closed ioloop's
    ``ValueError``, or a defect worth reading about). A session that never opened says where
    and why (``BrokerUnavailable``'s message)."""
    if isinstance(exc, BrokerUnavailable):
        log.warning("%s: %s; reconnecting in %.1f s", what, safe_reason(str(exc), 300, redact),
                    backoff)
        return
    expected = isinstance(exc, (*amqp_errors(), StoreUnavailable))
    log.warning("%s: session lost (%s); reconnecting in %.1f s%s", what,
                safe_reason(exc, 300, redact), backoff,
                "" if expected else "\n" + traceback_text(exc, redact))


def encode(queue: str, job_id: str) -> bytes:
    return json.dumps({"queue": queue, "job_id": job_id}, separators=(",", ":")).encode()


#: AMQP's ``message_id`` is a short string: at most 255 bytes.
MAX_MESSAGE_ID_BYTES = 255


def message_id(job_id: str) -> str:
    """A message's ``message_id``: its job id, or ``sha256:<hex>`` of a longer one (a job id
    may have up to ``validate.MAX_JOB_ID_BYTES``). Only people and tools read it; the body
    carries the id the consumer claims."""
    raw = job_id.encode()
    if len(raw) <= MAX_MESSAGE_ID_BYTES:
        return job_id
    return f"sha256:{hashlib.sha256(raw).hexdigest()}"


def decode(body: bytes) -> tuple[str, str] | None:
    """``(queue, job_id)`` from a message body, or None when it is not leaseq's: not its JSON,
    or a job id no store would take (NUL, a lone surrogate, too long), which every claim of it
    would refuse again."""
    try:
        data: Any = json.loads(body)
        queue, job_id = data["queue"], validate.job_id(data["job_id"])
    except (ValueError, TypeError, KeyError, InvalidJobId):
        return None
    if not isinstance(queue, str):
        return None
    return queue, job_id
