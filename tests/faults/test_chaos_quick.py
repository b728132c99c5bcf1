"""``scripts/chaos --quick`` inside the test command: one test per scenario and store.

A failure prints the table row, each violated invariant, the seed (replay with
``LEASEQ_CHAOS_SEED=N`` or ``scripts/chaos --seed N --only NAME``) and the kept history.
"""

from __future__ import annotations

import pytest
from chaos_scenarios import SCENARIOS, TASKS_DIR

from leaseq.testing.chaos import details, run_scenario, table


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_quick(name: str, chaos_store: tuple[str, str | None], chaos_seed: int,
                        chaos_root: str) -> None:
    kind, url = chaos_store
    outcome = run_scenario(name, SCENARIOS[name], kind, url, quick=True, seed=chaos_seed,
                           root=chaos_root, tasks_dir=TASKS_DIR)
    print(table([outcome]))
    if outcome.skipped:
        pytest.skip(outcome.skipped)
    assert outcome.ok, (f"{details([outcome])}\nseed {chaos_seed}: replay with "
                        f"scripts/chaos --seed {chaos_seed} --only {name}\n{table([outcome])}")
