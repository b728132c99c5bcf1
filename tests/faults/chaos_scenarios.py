"""The scenarios in order: issue 7's eleven, issue 16's periodic one, then issue 14's
partitions; name → ``run(r: Run)`` (``module`` or ``module:function``, default ``run``)."""

from __future__ import annotations

import importlib
import os

from leaseq.testing.chaos import Run, Scenario

TASKS_DIR = os.path.dirname(os.path.abspath(__file__))

_MODULES = (
    ("01-sigkill-storm", "sc_storm"),
    ("02-stale-worker", "sc_stale"),
    ("03-heartbeat-starve", "sc_starvation"),
    ("04-clock-skew", "sc_skew"),
    ("05-db-restart", "sc_restart"),
    ("06-poison", "sc_poison"),
    ("07-producer-replay", "sc_replay"),
    ("08-bad-input", "sc_badinput"),
    ("09-secret-canaries", "sc_canaries"),
    ("10-sigterm-drain", "sc_drain"),
    ("11-model-stateful", "sc_model"),
    ("12-periodic", "sc_periodic"),
    ("13-clean-partition", "sc_partition:clean"),
    ("14-black-hole", "sc_partition:hole"),
    ("15-flapping-link", "sc_partition:flap"),
)

#: Scenarios that start a PostgreSQL cluster of their own (a throwaway one on the veth) and
#: never use the shared server: its absence is no reason to skip them.
OWN_CLUSTER = frozenset({"13-clean-partition", "14-black-hole", "15-flapping-link"})


def _lazy(target: str) -> Scenario:
    module, _, function = target.partition(":")

    def run(r: Run) -> None:
        getattr(importlib.import_module(module), function or "run")(r)
    return run


SCENARIOS: dict[str, Scenario] = {name: _lazy(module) for name, module in _MODULES}
