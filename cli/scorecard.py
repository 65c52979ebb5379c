"""A run's scorecard: each recovery phase's time against its objective, and what that time was spent waiting on."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter

from activities.retry import Duration, format_duration
from cli.timeline import Timeline

__all__ = ["PhaseScore", "Scorecard", "said_duration", "score", "scorecard_rows"]

# Steps whose own time (bakes and holds aside) is spent waiting for gates to pass.
_GATED_KINDS = ("gate", "ramp")
_Span = tuple[datetime, datetime]


@dataclass
class PhaseScore:
    """One phase: its objective and measured time, split into what it waited on and the rest (steps working)."""

    name: str
    until: str
    objective_s: float | None
    measured_s: float | None = None  # None: the run never reached the phase's end
    operators_s: float = 0.0  # approvals and holds, until someone decided
    gates_s: float = 0.0  # gate and ramp steps reading until their gates passed
    bakes_s: float = 0.0  # wait steps, bakes, retry delays
    working_s: float = 0.0

    @property
    def met(self) -> bool | None:
        if self.measured_s is None or self.objective_s is None:
            return None
        return self.measured_s <= self.objective_s


@dataclass
class Scorecard:
    workflow_id: str
    runbook: str
    runbook_digest: str
    target: str
    started: datetime | None
    outcome: str
    rto_s: float | None
    wall_s: float | None
    phases: list[PhaseScore] = field(default_factory=list)
    # The controller that resolved the run (its version, its actions' contracts digest).
    controller: str = ""
    contracts: str = ""

    @property
    def met(self) -> bool | None:
        verdicts = [p.met for p in self.phases] + [None if self.rto_s is None or self.wall_s is None or
                                                   self.outcome != "succeeded" else self.wall_s <= self.rto_s]
        if any(v is False for v in verdicts):
            return False
        return True if any(v is True for v in verdicts) and self.outcome == "succeeded" else None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Scorecard:
        """A scorecard kept as to_json wrote it (derived fields dropped)."""
        fields = {k: v for k, v in data.items() if k not in ("met", "phases")}
        fields["started"] = datetime.fromisoformat(data["started"]) if data.get("started") else None
        phases = [PhaseScore(**{k: v for k, v in p.items() if k != "met"}) for p in data.get("phases") or []]
        return cls(**fields, phases=phases)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["started"] = self.started.isoformat() if self.started else None
        data["met"] = self.met
        for phase, entry in zip(self.phases, data["phases"], strict=True):
            entry["met"] = phase.met
        return data


def _seconds(value: Any) -> float | None:
    """An objective as the run recorded it: seconds (pydantic's JSON for a timedelta is ISO 8601 or a number)."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    return TypeAdapter(Duration).validate_python(value).total_seconds()


def _clip(spans: list[_Span], window: _Span) -> list[_Span]:
    start, end = window
    return [(max(a, start), min(b, end)) for a, b in spans if min(b, end) > max(a, start)]


def _union(spans: list[_Span]) -> list[_Span]:
    merged: list[_Span] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _minus(spans: list[_Span], taken: list[_Span]) -> list[_Span]:
    """`spans` (a union) without the time in `taken` (a union)."""
    left: list[_Span] = []
    for a, b in spans:
        cursor = a
        for c, d in taken:
            if d <= cursor or c >= b:
                continue
            if c > cursor:
                left.append((cursor, c))
            cursor = max(cursor, d)
        if cursor < b:
            left.append((cursor, b))
    return left


def _measure(spans: list[_Span]) -> float:
    return sum((b - a).total_seconds() for a, b in spans)


def _split(timeline: Timeline, window: _Span, phase: PhaseScore) -> None:
    """Split the window's time: operators first, then bakes, then gates; what is left is steps working.
    Parallel steps' waits overlap in time; each second is counted once, under the first that claims it."""
    end_of_run = timeline.wall_end() or window[1]
    operators: list[_Span] = []
    bakes: list[_Span] = []
    gated: list[_Span] = []
    for summary in timeline.steps.values():
        for wait in summary.waits:
            span = (wait.started, wait.ended or min(summary.ended, end_of_run))
            (bakes if wait.kind == "timer" else operators).append(span)
        if summary.kind in _GATED_KINDS:
            gated.append((summary.started, summary.ended))
    claimed = _union(_clip(operators, window))
    phase.operators_s = _measure(claimed)
    bake_time = _minus(_union(_clip(bakes, window)), claimed)
    phase.bakes_s = _measure(bake_time)
    claimed = _union(claimed + bake_time)
    phase.gates_s = _measure(_minus(_union(_clip(gated, window)), claimed))
    phase.working_s = max(0.0, (window[1] - window[0]).total_seconds() - phase.operators_s - phase.bakes_s - phase.gates_s)


def score(timeline: Timeline) -> Scorecard | None:
    """The scorecard of a run whose runbook states objectives; None for one that states none."""
    objectives = timeline.objectives
    if not objectives:
        return None
    wall_end = timeline.wall_end()
    wall = (wall_end - timeline.started).total_seconds() if timeline.started and wall_end else None
    card = Scorecard(workflow_id=timeline.workflow_id, runbook=timeline.runbook, runbook_digest=timeline.runbook_digest,
                     controller=timeline.controller, contracts=timeline.contracts,
                     target=timeline.target, started=timeline.started, outcome=timeline.outcome,
                     rto_s=_seconds(objectives.get("rto")), wall_s=wall)
    cursor = timeline.started
    for name, spec in (objectives.get("phases") or {}).items():
        phase = PhaseScore(name=name, until=spec.get("until", ""), objective_s=_seconds(spec.get("within")))
        card.phases.append(phase)
        ended = timeline.steps.get(phase.until)
        if cursor is None or ended is None or ended.status != "succeeded":
            cursor = None  # the phases after an unreached one are unreached too
            continue
        phase.measured_s = max(0.0, (ended.ended - cursor).total_seconds())
        _split(timeline, (cursor, ended.ended), phase)
        cursor = ended.ended
    return card


def said_duration(seconds: float | None) -> str:
    """A measured time as every view writes durations, tenths under a minute; `-` for none."""
    return "-" if seconds is None else format_duration(round(seconds, 1 if seconds < 60 else 0))


def scorecard_rows(card: Scorecard) -> list[list[str]]:
    """The scorecard as table rows: phase, objective, measured, met, operators, gates, bakes, working."""
    def verdict(met: bool | None) -> str:
        return {True: "met", False: "MISSED", None: "-"}[met]

    rows = [[p.name, said_duration(p.objective_s), said_duration(p.measured_s), verdict(p.met), said_duration(p.operators_s),
             said_duration(p.gates_s), said_duration(p.bakes_s), said_duration(p.working_s)] for p in card.phases]
    rto_met = None if card.rto_s is None or card.wall_s is None or card.outcome != "succeeded" else card.wall_s <= card.rto_s
    rows.append(["whole run", said_duration(card.rto_s), said_duration(card.wall_s), verdict(rto_met),
                 said_duration(sum(p.operators_s for p in card.phases)), said_duration(sum(p.gates_s for p in card.phases)),
                 said_duration(sum(p.bakes_s for p in card.phases)), said_duration(sum(p.working_s for p in card.phases))])
    return rows
