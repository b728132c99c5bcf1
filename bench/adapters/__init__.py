"""One module per queue library under test; ``system_class`` picks one by name."""

from __future__ import annotations

from bench.systems import System


def system_class(name: str) -> type[System]:
    """The adapter class for ``name`` (imported on demand: competitors are optional)."""
    if name == "leaseq":
        from bench.adapters.leaseq import LeaseqSystem as cls
    elif name == "raw-sql":
        from bench.ceiling import RawSQLSystem as cls
    elif name == "pgqueuer":
        from bench.adapters.pgqueuer_adapter import PgQueuerSystem as cls
    elif name == "procrastinate":
        from bench.adapters.procrastinate_adapter import ProcrastinateSystem as cls
    elif name == "huey":
        from bench.adapters.huey_adapter import HueySystem as cls
    else:
        raise KeyError(f"no adapter named {name!r}")
    return cls


COMPETITORS = ("pgqueuer", "procrastinate", "huey")
