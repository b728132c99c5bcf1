"""One RabbitMQ connection per process, opened from an ``amqp://`` URL, with the wake-up body
leaseq publishes. pika is imported here and only here, when a connection is opened."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from leaseq.errors import InvalidURL, LeaseqError, StoreUnavailable
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
    ioloop, depending on where the drop caught it."""
    return isinstance(exc, LeaseqError) and not isinstance(exc, StoreUnavailable)


def open_connection(amqp_url: str, *, heartbeat_s: int = 30,
                    name: str = "leaseq") -> BlockingConnection:
    """A blocking connection; ``InvalidURL`` (password masked) when the URL is unusable."""
    import pika

    try:
        params = pika.URLParameters(amqp_url)
    except Exception as exc:
        raise InvalidURL(f"cannot use AMQP URL {redact_url(amqp_url)}: {exc}") from None
    params.heartbeat = heartbeat_s
    params.blocked_connection_timeout = max(heartbeat_s * 2, 60)
    params.client_properties = {"connection_name": name}
    return pika.BlockingConnection(params)


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
                 max_backoff_s: float) -> None:
    """Call ``run`` until ``stop`` is set; after an error that is not ``is_fatal`` wait
    (0.5 s doubling up to ``max_backoff_s``) and call it again. Fatal errors are raised."""
    backoff = 0.5
    while not stop.is_set():
        try:
            run()
            backoff = 0.5
        except Exception as exc:
            if is_fatal(exc):
                raise
            _log_lost(what, exc, backoff)
            stop.wait(backoff)
            backoff = min(backoff * 2, max_backoff_s)


def _log_lost(what: str, exc: Exception, backoff: float) -> None:
    """One warning per lost session; a traceback only for what is not a known broker or
    store error (a closed ioloop's ``ValueError``, or a defect worth reading about)."""
    expected = isinstance(exc, (*amqp_errors(), StoreUnavailable))
    log.warning("%s: session lost (%s: %s); reconnecting in %.1f s", what,
                type(exc).__name__, str(exc)[:300], backoff, exc_info=not expected)


def encode(queue: str, job_id: str) -> bytes:
    return json.dumps({"queue": queue, "job_id": job_id}, separators=(",", ":")).encode()


def decode(body: bytes) -> tuple[str, str] | None:
    """``(queue, job_id)`` from a message body, or None when it is not leaseq's."""
    try:
        data: Any = json.loads(body)
        queue, job_id = data["queue"], data["job_id"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(queue, str) or not isinstance(job_id, str) or not job_id:
        return None
    return queue, job_id
