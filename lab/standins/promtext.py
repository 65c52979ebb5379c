"""Prometheus text exposition and go-metrics style JSON helpers shared by the stand-ins."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ["SampleWindow", "Series", "quantile", "render"]

# generate_latest spells whole numbers as Python does ("1.0"); Go's exposition, which Consul and Nomad
# serve, writes "1" (both write 1.234567e+06 from a million on).
_WHOLE = re.compile(r"^([^#].* -?\d+)\.0$", re.MULTILINE)


@dataclass
class Series:
    name: str
    kind: str  # gauge | summary
    value: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)
    quantiles: Mapping[float, float] | None = None  # summaries only
    count: int = 0
    total: float = 0.0


class _SeriesCollector(Collector):
    """One scrape's series as metric families, as go-metrics' Prometheus sink exposes them: HELP is the
    name, a summary's samples are its quantiles then _sum and _count."""

    def __init__(self, series: Iterable[Series]) -> None:
        self._series = series

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}  # one family per name, in first-seen order
        for s in self._series:
            family = families.get(s.name)
            if family is None:
                kind = SummaryMetricFamily if s.kind == "summary" else GaugeMetricFamily
                family = families[s.name] = kind(s.name, s.name)
            labels = dict(s.labels)
            if s.kind == "summary":
                for q, v in sorted((s.quantiles or {}).items()):
                    family.add_sample(s.name, {**labels, "quantile": str(q)}, v)
                family.add_sample(f"{s.name}_sum", labels, s.total)
                family.add_sample(f"{s.name}_count", labels, s.count)
            else:
                family.add_sample(s.name, labels, s.value)
        yield from families.values()


def render(series: Iterable[Series]) -> str:
    """Prometheus text format 0.0.4 as the Go agents write it, from a private registry (not the process's)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SeriesCollector(series))
    return _WHOLE.sub(r"\1", generate_latest(registry).decode())


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
