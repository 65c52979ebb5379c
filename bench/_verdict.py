"""A bench's verdict: its goals judged on medians over rounds, NOT met on any failure counted beside them.

A goal whose figure is missing (no rounds, no series) is not met: the line says "no data", never "met".
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = ["Goal", "Verdict", "alternated", "at_most", "median", "no_more_than", "samples_table", "under"]

T = TypeVar("T")


@dataclass(frozen=True)
class Goal:
    """One goal: its name, whether it holds, and the figure it was judged on."""

    name: str
    met: bool
    figure: str = ""

    def __str__(self) -> str:
        return f"{self.name}: {'yes' if self.met else 'NO'}" + (f" ({self.figure})" if self.figure else "")


@dataclass(frozen=True)
class Verdict:
    """Goals and failure counts; met only with at least one goal, every goal met and every count zero."""

    goals: Sequence[Goal]
    failures: Mapping[str, int] = field(default_factory=dict)

    @property
    def met(self) -> bool:
        return bool(self.goals) and all(goal.met for goal in self.goals) and not any(self.failures.values())

    def line(self, label: str = "goal") -> str:
        """One line: `goal met` or `goal NOT met`, each goal with its figure, then the failure counts."""
        parts = [str(goal) for goal in self.goals] or ["no goal judged"]
        if self.failures:
            parts.append(", ".join(f"{what} {n}" for what, n in self.failures.items()))
        return f"{label} {'met' if self.met else 'NOT met'}: " + "; ".join(parts)


def median(values: Sequence[float | None]) -> float | None:
    """The median of the rounds that have a figure; None when none has (a missing series)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def under(name: str, value: float | None, limit: float, unit: str = "") -> Goal:
    """`value < limit`; a missing value is not met."""
    if value is None:
        return Goal(name, False, "no data")
    return Goal(name, value < limit, f"{value:.4g}{unit} against < {limit:.4g}{unit}")


def at_most(name: str, value: float | None, limit: float, unit: str = "") -> Goal:
    """`value <= limit`; a missing value is not met."""
    if value is None:
        return Goal(name, False, "no data")
    return Goal(name, value <= limit, f"{value:.4g}{unit} against <= {limit:.4g}{unit}")


def no_more_than(name: str, value: float | None, reference: float | None, unit: str = "") -> Goal:
    """`value <= reference`, both measured; either missing is not met (a missing series is not "no higher")."""
    if value is None or reference is None:
        return Goal(name, False, f"no data ({_fmt(value, unit)} against {_fmt(reference, unit)})")
    return Goal(name, value <= reference, f"{value:.4g}{unit} against {reference:.4g}{unit}")


def alternated(variants: Sequence[T], round_: int) -> list[T]:
    """The order of round `round_` (from 0): as given in even rounds, reversed in odd ones."""
    return list(variants) if round_ % 2 == 0 else list(reversed(variants))


def samples_table(samples: Mapping[str, Sequence[float | None]], what: str, unit: str, digits: int) -> list[str]:
    """Rows of median, min, max and failed runs (None) per name, over the rounds that have a figure."""
    width = max([len(what), *map(len, samples)])
    rows = [f"{what:<{width}} {'median ' + unit:>10} {'min':>8} {'max':>8}  failed"]
    for name, values in samples.items():
        present = [v for v in values if v is not None]
        figures = (" ".join(f"{v:{n}.{digits}f}" for v, n in ((statistics.median(present), 10), (min(present), 8),
                                                              (max(present), 8))) if present
                   else f"{'-':>10} {'-':>8} {'-':>8}")
        rows.append(f"{name:<{width}} {figures}  {len(values) - len(present)}")
    return rows


def _fmt(value: float | None, unit: str) -> str:
    return "no data" if value is None else f"{value:.4g}{unit}"
