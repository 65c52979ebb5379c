"""Prometheus text exposition and go-metrics style JSON helpers shared by the stand-ins."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["Series", "render", "quantile", "SampleWindow"]


@dataclass
class Series:
    name: str
    kind: str  # gauge | counter | summary
    value: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)
    quantiles: Mapping[float, float] | None = None  # summaries only
    count: int = 0
    total: float = 0.0


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _labels(labels: Mapping[str, str], extra: Mapping[str, str] | None = None) -> str:
    merged = dict(labels)
    if extra:
        merged.update(extra)
    if not merged:
        return ""
    body = ",".join(
        f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in sorted(merged.items())
    )
    return "{" + body + "}"


def render(series: Iterable[Series]) -> str:
    """Prometheus text format 0.0.4; one TYPE line per metric family."""
    lines: list[str] = []
    # The exposition format needs each family's samples contiguous, so group first.
    families: dict[str, list[Series]] = {}
    for s in series:
        families.setdefault(s.name, []).append(s)
    for name, members in families.items():
        lines.append(f"# HELP {name} {name}")
        lines.append(f"# TYPE {name} {members[0].kind}")
        for s in members:
            lines.extend(_sample_lines(s))
    return "\n".join(lines) + "\n"


def _sample_lines(s: Series) -> list[str]:
    lines: list[str] = []
    if s.kind == "summary":
        for q, v in sorted((s.quantiles or {}).items()):
            lines.append(f"{s.name}{_labels(s.labels, {'quantile': str(q)})} {_fmt(v)}")
        lines.append(f"{s.name}_sum{_labels(s.labels)} {_fmt(s.total)}")
        lines.append(f"{s.name}_count{_labels(s.labels)} {s.count}")
    else:
        lines.append(f"{s.name}{_labels(s.labels)} {_fmt(s.value)}")
    return lines


def quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    idx = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[idx]


class SampleWindow:
    """Observations kept for max_age seconds, like go-metrics' Prometheus summaries
    (MaxAge 10s): an empty window reports NaN quantiles, as real agents do."""

    def __init__(self, max_age: float = 10.0) -> None:
        self.max_age = max_age
        self.samples: list[tuple[float, float]] = []
        self.count = 0
        self.total = 0.0
        self.last_update: float | None = None

    def observe(self, now: float, value: float) -> None:
        self.samples.append((now, value))
        self.count += 1
        self.total += value
        self.last_update = now
        if len(self.samples) > 20000:
            del self.samples[: len(self.samples) - 20000]

    def values(self, now: float) -> list[float]:
        cutoff = now - self.max_age
        self.samples = [(t, v) for t, v in self.samples if t >= cutoff]
        return sorted(v for _, v in self.samples)

    def quantiles(self, now: float, qs: Iterable[float] = (0.5, 0.9, 0.99)) -> dict[float, float]:
        vals = self.values(now)
        return {q: quantile(vals, q) for q in qs}
