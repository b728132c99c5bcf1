"""Input checks shared by every store: run before anything is written."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from leaseq.errors import InvalidInput, InvalidJobId, InvalidPayload, InvalidQueueName
from leaseq.redact import redact_url as redact_url  # its home is leaseq.redact

MAX_JOB_ID_BYTES = 512
MAX_ERROR_CHARS = 2000

#: Fields of the record; in MongoDB they sit beside the payload's own keys, so a payload may
#: not use them at its top level (on every store, so a job moves between stores unchanged).
RESERVED_KEYS = frozenset(
    {
        "_id", "id", "queue", "task", "status", "payload", "attempts", "max_attempts",
        "lease_until", "lease_epoch", "worker_id", "error", "failure", "revision", "stale",
        "result", "result_key", "created_at", "updated_at", "first_seen_at", "published_at",
        "snoozes", "givebacks", "priority", "concurrency_key", "next_concurrency_key",
        "moved_by", "claim_token",
    }
)  # fmt: skip

_QUEUE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_STATUS_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")


def queue_name(name: Any) -> str:
    if not isinstance(name, str) or not _QUEUE_RE.fullmatch(name):
        raise InvalidQueueName(
            f"queue name {str(name)[:80]!r} is not allowed: use 1-64 characters of letters, "
            "digits, '_', '.' or '-', starting with a letter or digit"
        )
    return name


def utf8_size(text: str) -> int | None:
    """The size of ``text`` in UTF-8; None when it holds a lone surrogate (no UTF-8 exists).
    The caller raises its own error: nothing is built for the error on the common path."""
    if text.isascii():  # one byte per character, and no surrogate
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def job_id(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidJobId("a job id must be a non-empty string")
    size = utf8_size(value)
    if size is None:
        raise InvalidJobId("a job id must be valid Unicode (no lone surrogates)")
    if size > MAX_JOB_ID_BYTES:
        raise InvalidJobId(f"a job id may have at most {MAX_JOB_ID_BYTES} bytes, got {size}")
    if "\x00" in value:
        raise InvalidJobId("a job id may not contain NUL characters")
    return value


def worker_id(value: Any) -> str:
    if (not isinstance(value, str) or not value or len(value) > 256 or "\x00" in value
            or utf8_size(value) is None):
        raise InvalidInput("worker_id must be a non-empty string of at most 256 characters, "
                           "valid Unicode without NUL")
    return value


#: The most rows one call takes or reads (a claim, a page of jobs, an outbox batch).
MAX_BATCH = 10_000


def batch_size(value: Any, name: str = "limit") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH:
        raise InvalidInput(f"{name} must be a whole number from 1 to {MAX_BATCH}, "
                           f"got {str(value)[:40]!r}")
    return value


def status_name(value: Any) -> str:
    """A status's name: leaseq's own, or an app's terminal one."""
    if not isinstance(value, str) or not _STATUS_RE.fullmatch(value):
        raise InvalidInput(f"status {str(value)[:80]!r} must match [a-z][a-z0-9_]{{0,63}}")
    return value


def terminal_status(status: Any) -> str:
    """An app-chosen finishing status: ``done`` or a lower-case name that is not a live state."""
    status_name(status)
    if status in ("pending", "processing"):
        raise InvalidInput(f"a job cannot be finished with the live status {status!r}")
    return status


#: The longest delay (and lease, and policy duration) leaseq takes: ten years.
MAX_DELAY_S = 10 * 365 * 86400


def delay_s(value: Any, name: str = "delay_s") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):  # a tuple: faster here
        raise InvalidInput(f"{name} must be a number of seconds, got {type(value).__name__}")
    if type(value) is int and value > MAX_DELAY_S:  # before isfinite: 10**400 is no float
        raise InvalidInput(f"{name} may be at most ten years, got {str(value)[:40]}")
    if not math.isfinite(value) or value < 0:
        raise InvalidInput(f"{name} must be a finite number ≥ 0, got {value!r}")
    if value > MAX_DELAY_S:
        raise InvalidInput(f"{name} may be at most ten years, got {value!r}")
    return float(value)


#: The range of a job's priority: PostgreSQL's ``integer``.
PRIORITY_RANGE = (-(2**31), 2**31 - 1)
MAX_CONCURRENCY_KEY_CHARS = 200


def priority(value: Any) -> int:
    low, high = PRIORITY_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"priority must be a whole number from {low} to {high}, "
                           f"got {str(value)[:40]!r}")
    return value


def concurrency_key(value: Any) -> str | None:
    if value is None:
        return None
    if not text_field(value, MAX_CONCURRENCY_KEY_CHARS):
        raise InvalidInput(f"concurrency_key must be a non-empty string of at most "
                           f"{MAX_CONCURRENCY_KEY_CHARS} characters, valid Unicode without "
                           "NUL, or None")
    return value


def text_field(value: Any, max_chars: int, *, empty: bool = False) -> bool:
    """Whether ``value`` is text a store can hold in a field of ``max_chars``: a string
    (empty only when ``empty``), without NUL, and valid Unicode (a lone surrogate, as in a
    file name from ``os.listdir``, has no UTF-8: every store's driver refuses it)."""
    return (isinstance(value, str) and (empty or bool(value)) and len(value) <= max_chars
            and "\x00" not in value and utf8_size(value) is not None)


def payload(value: Any, max_bytes: int) -> str:
    """Check a payload and give its canonical JSON text (sorted keys, no spaces)."""
    if type(value) is not dict and not isinstance(value, Mapping):  # a dict skips the ABC
        kind = type(value).__name__
        raise InvalidPayload(f"a payload must be a JSON object (a dict), got {kind}")
    if not RESERVED_KEYS.isdisjoint(value):  # one C-level pass over the keys
        key = next(k for k in value if k in RESERVED_KEYS)
        raise InvalidPayload(f"payload key {key!r} is reserved for the job record; rename it")
    _check_keys(value, depth=0)
    return canonical_json(value, max_bytes, what="payload")


def result(value: Any, max_bytes: int) -> str | None:
    """A handler's result as canonical JSON, or None when there is none."""
    if value is None:
        return None
    return canonical_json(value, max_bytes, what="result")


def result_key(value: Any) -> str | None:
    """Where a large result lives (a path, a URL): text of at most 1,024 characters, no NUL."""
    if value is None:
        return None
    if not text_field(value, 1024):
        raise InvalidPayload("result_key must be a non-empty string of at most 1024 characters, "
                             "valid Unicode without NUL")
    return value


def _canonical_encoder() -> Callable[[Any], str]:
    """Sorted keys, no spaces, no NaN, text as is: ``json.dumps`` with these arguments, minus
    the work ``json`` redoes on every call (an encoder object, then its C encoder, then the
    circular-reference bookkeeping): the C encoder is made once, from the encoder's own
    settings, without that bookkeeping, which is about three times faster on a small payload
    and writes the same text. A cycle still fails, as a RecursionError (payloads are walked to
    a bounded depth before this)."""
    encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False,
                               ensure_ascii=False, check_circular=False)
    make = getattr(json.encoder, "c_make_encoder", None)  # not in the type stubs
    if make is None:  # no C accelerator in this interpreter
        return encoder.encode
    chunks = make(None, encoder.default, json.encoder.encode_basestring, encoder.indent,
                  encoder.key_separator, encoder.item_separator, encoder.sort_keys,
                  encoder.skipkeys, encoder.allow_nan)
    return lambda value: "".join(chunks(value, 0))


_CANONICAL = _canonical_encoder()


def canonical_json(value: Any, max_bytes: int, what: str) -> str:
    try:
        text = _CANONICAL(value)
    except ValueError as exc:
        raise InvalidPayload(f"{what} holds a value JSON cannot carry (NaN or Infinity?): "
                             f"{str(exc)[:200]}") from None
    except TypeError as exc:
        raise InvalidPayload(f"{what} is not JSON: {str(exc)[:200]}") from None
    except RecursionError:
        raise InvalidPayload(f"{what} is nested too deeply to store") from None
    size = utf8_size(text)
    if size is None:
        raise InvalidPayload(f"{what} holds a string that is not valid Unicode (a lone surrogate)")
    if size > max_bytes:
        raise InvalidPayload(f"{what} is {size} bytes as JSON; the limit is {max_bytes}")
    return text


_MAX_DEPTH = 100


#: Values with nothing inside to check: exact types, so a subclass still takes the long way.
_LEAVES = frozenset({str, int, float, bool, type(None)})


def _check_keys(value: Any, depth: int) -> None:
    """Keys must be strings without '$' first, '.' or NUL: MongoDB can't store them as given."""
    if depth > _MAX_DEPTH:
        raise InvalidPayload(f"payload is nested deeper than {_MAX_DEPTH} levels")
    # A leaf one level down passes the depth check there as long as depth < _MAX_DEPTH.
    shallow = depth < _MAX_DEPTH
    if type(value) is dict or isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidPayload(f"payload keys must be strings, got {type(key).__name__}")
            if key.startswith("$") or "." in key or "\x00" in key:
                raise InvalidPayload(
                    f"payload key {key[:80]!r} may not start with '$' or hold '.' or NUL"
                )
            if not (shallow and type(item) in _LEAVES):
                _check_keys(item, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            if not (shallow and type(item) in _LEAVES):
                _check_keys(item, depth + 1)


def error_text(text: str | None) -> str | None:
    """Error text as stored: its last 2,000 characters (the end of a traceback says most)."""
    if text is None:
        return None
    return text[-MAX_ERROR_CHARS:]
