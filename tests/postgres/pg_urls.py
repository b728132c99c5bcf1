"""PostgreSQL test URLs: the one helper that adds store options to a URL."""

from __future__ import annotations


def with_option(url: str, **options: object) -> str:
    """``url`` with ``options`` added to its query string (``schema=``, ``reconnect_s=``, …)."""
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"
