"""Summaries of repeated measurements: median with min–max, and percentiles."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    """Median and range of a scenario's repeats (values in the scenario's unit)."""

    median: float
    low: float
    high: float
    runs: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        if not values:
            raise ValueError("no measurements to summarise")
        return cls(statistics.median(values), min(values), max(values), tuple(values))

    def text(self, form: str = "{}") -> str:
        """``median [low–high]``, each number written with ``form`` (a ``str.format``)."""
        return f"{form.format(self.median)} [{form.format(self.low)}–{form.format(self.high)}]"

    def to_dict(self) -> dict[str, object]:
        return {"median": self.median, "min": self.low, "max": self.high, "runs": list(self.runs)}


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear-interpolated percentile (``pct`` in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = (len(ordered) - 1) * pct / 100
    below = int(rank)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (rank - below)
