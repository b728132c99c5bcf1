"""The fault-injection harness behind ``scripts/chaos`` and ``tests/faults`` (issue 7).

A *scenario* is a function ``run(r: Run) -> None``: it breaks something on purpose (SIGKILL,
SIGSTOP, a restarted server, a skewed clock, hostile input) and then measures, from the store's
records, its journal and an effects ledger, the promise "no job lost, no stale write, poison
stopped". It fills ``r.counts`` (the table's columns) and calls ``r.check`` once per invariant.

Effects are counted, not guessed: a handler records each side effect in ``Ledger`` under the
key ``job id + effect name`` (a UNIQUE column); a second attempt at a key is kept as a repeat
with the lease epoch that made it, and is judged against the first making of that same key. A
repeat by a *later* epoch of a job whose earlier lease was lost (its worker was killed) is a
"fenced re-run", which at-least-once execution allows and the table reports on its own column;
a repeat by the *same* epoch, or by an epoch after the one that *first* finished the job (its
journal's first terminal event), is a duplicate effect, which is a violation.

Every run keeps a JSON-lines event log; a failing run keeps its whole folder (store file, ledger,
worker logs, events) and prints the seed that replays it.

``ledger`` holds the effects ledger, ``run`` the ``Run`` a scenario gets and its worker
processes, ``measure`` the checks scenarios share, ``report`` the table and ``main``.
"""

from leaseq.testing.chaos.ledger import Ledger
from leaseq.testing.chaos.measure import (
    all_terminal,
    free_port,
    jobs_by_id,
    settle,
    wait_until,
)
from leaseq.testing.chaos.report import details, main, postgres_reachable, stores_from, table
from leaseq.testing.chaos.run import (
    DEFAULT_POSTGRES_URL,
    Check,
    Counts,
    Run,
    Scenario,
    ScenarioResult,
    Skip,
    WorkerProc,
    run_scenario,
)

__all__ = [
    "DEFAULT_POSTGRES_URL",
    "Check",
    "Counts",
    "Ledger",
    "Run",
    "Scenario",
    "ScenarioResult",
    "Skip",
    "WorkerProc",
    "all_terminal",
    "details",
    "free_port",
    "jobs_by_id",
    "main",
    "postgres_reachable",
    "run_scenario",
    "settle",
    "stores_from",
    "table",
    "wait_until",
]
