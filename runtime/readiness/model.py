"""A readiness check and its verdict: ready, not ready or unknown, with the evidence."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["EXIT_CODES", "METRIC_VALUES", "Check", "Report", "Result", "State", "Verdict", "not_ready", "ready",
           "unknown"]

State = Literal["ready", "not_ready", "unknown"]

# The gauge's value per state: one series per check, so an alert reads it without a state label.
METRIC_VALUES: dict[State, int] = {"ready": 1, "not_ready": 0, "unknown": -1}
# The command's exit code when this is the worst state among the checks.
EXIT_CODES: dict[State, int] = {"ready": 0, "not_ready": 1, "unknown": 3}


@dataclass(frozen=True)
class Verdict:
    state: State
    evidence: str


def ready(evidence: str) -> Verdict:
    return Verdict("ready", evidence)


def not_ready(evidence: str) -> Verdict:
    return Verdict("not_ready", evidence)


def unknown(evidence: str) -> Verdict:
    return Verdict("unknown", evidence)


@dataclass(frozen=True)
class Check:
    """One question about the recovery path: `name` is stable (the metric's check label), `probe` answers it."""

    name: str
    kind: str
    probe: Callable[[], Awaitable[Verdict]]
    timeout: float = 10.0


@dataclass(frozen=True)
class Result:
    check: str
    kind: str
    state: State
    evidence: str
    seconds: float


@dataclass
class Report:
    runbook: str
    target: str
    checked_at: float
    results: list[Result] = field(default_factory=list)

    @property
    def state(self) -> State:
        """Not ready if any check is; else unknown if any is; else ready."""
        states = {r.state for r in self.results}
        return "not_ready" if "not_ready" in states else "unknown" if "unknown" in states else "ready"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.state]

    def as_json(self) -> dict[str, object]:
        return {
            "runbook": self.runbook, "target": self.target, "checked_at": self.checked_at, "state": self.state,
            "checks": [{"check": r.check, "kind": r.kind, "state": r.state, "evidence": r.evidence,
                        "seconds": round(r.seconds, 3)} for r in self.results],
        }
