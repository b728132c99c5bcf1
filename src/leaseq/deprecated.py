"""Old public names, kept for one release after their rename: each use warns with a
``DeprecationWarning`` naming the new one, then does what the new one does.

Renamed in 0.2 (to be removed in 0.3): ``Queue.list`` / ``Store.list`` → ``list_jobs``;
``Queue.retry`` / ``Store.retry`` → ``requeue``; ``Queue.claim_id`` / ``Store.claim_id`` →
``claim_one``; ``Store.record`` → ``append_journal``; ``leaseq.Outcome`` /
``leaseq.job.Outcome`` → ``EnqueueOutcome``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any


def warn_renamed(old: str, new: str) -> None:
    """Warn the caller of a deprecated name (two frames up: past the alias that calls this)."""
    warnings.warn(f"{old} is deprecated and will be removed in leaseq 0.3; use {new}",
                  DeprecationWarning, stacklevel=3)


def module_getattr(module: str, renamed: Mapping[str, str],
                   scope: Mapping[str, Any]) -> Callable[[str], Any]:
    """A module's ``__getattr__`` that answers each old name of ``renamed`` with the object
    its new name holds in ``scope`` (the module's globals), warning."""

    def __getattr__(name: str) -> Any:
        if name not in renamed:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warn_renamed(f"{module}.{name}", f"{module}.{renamed[name]}")
        return scope[renamed[name]]

    return __getattr__
