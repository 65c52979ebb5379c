"""Run events for notification sinks: what changed in a run's status, offered to the worker without waiting."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from temporalio import workflow

from workflows.contract import RunStatus, StepState

__all__ = ["EVENT_KINDS", "EventSink", "RunNotices", "Snapshot", "event_sink", "phase_times", "run_events", "set_event_sink"]

# What a sink may subscribe to; `finished` carries the run's phase times against its objectives.
EVENT_KINDS = ("started", "awaiting_approval", "held", "step_failed", "step_back", "finished")

EventSink = Callable[[dict[str, Any]], None]
_sink: EventSink | None = None


def set_event_sink(sink: EventSink | None) -> None:
    """The worker's notifier (runtime/notifications.py); its call must return at once, whatever its sinks do."""
    global _sink
    _sink = sink


def event_sink() -> EventSink | None:
    return _sink


def _said(step: StepState) -> str:
    return step.title or step.id


def phase_times(status: RunStatus, objectives: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each objective phase's time from the run's own record (the end of the phase before it to its `until` step's
    end); None where the run never got there. The full split of waits is `coldstart scorecard`'s."""
    if not objectives:
        return []
    steps = {s.id: s for s in status.steps}
    cursor: datetime | None = status.started_at
    phases = []
    for name, spec in (objectives.get("phases") or {}).items():
        step = steps.get(spec.get("until", ""))
        took = None
        if cursor is not None and step is not None and step.status == "succeeded" and step.ended_at is not None:
            took = (step.ended_at - cursor).total_seconds()
            cursor = step.ended_at
        else:
            cursor = None
        within = spec.get("within")
        phases.append({"phase": name, "until": spec.get("until"), "took_s": took,
                       "objective_s": within.total_seconds() if hasattr(within, "total_seconds") else within})
    return phases


@dataclass(frozen=True)
class Snapshot:
    """What the events compare between two readings of a run's status (the status holds live step objects)."""

    state: str
    steps: dict[str, tuple[str, int | None]]

    @classmethod
    def of(cls, status: RunStatus) -> Snapshot:
        return cls(status.state, {s.id: (s.status, s.percent) for s in status.steps})


def run_events(before: Snapshot | None, after: RunStatus, *, objectives: dict[str, Any] | None = None
               ) -> list[dict[str, Any]]:
    """The events between a snapshot of a run's status and its status now (None before: the run just started)."""
    run = {"workflow_id": after.workflow_id, "runbook": after.runbook, "target": after.target,
           "initiator": after.initiator, "drill": after.drill}
    events: list[dict[str, Any]] = []

    def add(kind: str, **fields: Any) -> None:
        events.append({"event": kind, **run, **fields})

    if before is None:
        add("started", runbook_digest=after.runbook_digest)
    old = before.steps if before is not None else {}
    for step in after.steps:
        was_status, was_percent = old.get(step.id, ("pending", None))
        status = step.status
        if status != was_status:
            if status == "awaiting_approval":
                add("awaiting_approval", step=step.id, title=_said(step), prompt=step.awaiting,
                    approvers=after.approvers.get(step.id), verified="approve" in after.identity_required)
            elif status == "held":
                add("held", step=step.id, title=_said(step), error=step.error, skippers=after.skippers,
                    operators=after.operators)
            elif status == "failed":
                add("step_failed", step=step.id, title=_said(step), error=step.error)
        if step.kind == "ramp" and was_percent is not None and step.percent is not None and step.percent < was_percent:
            add("step_back", step=step.id, title=_said(step), from_percent=was_percent, to_percent=step.percent,
                error=step.error)
    ended = ("succeeded", "failed", "aborted", "rolled_back")
    if after.state in ended and (before is None or before.state not in ended):
        wall = (after.ended_at - after.started_at).total_seconds() if after.ended_at else None
        add("finished", state=after.state, error=after.error, wall_s=wall, phases=phase_times(after, objectives))
    return events


class RunNotices:
    """A run's events, offered to the worker's sink as its status changes: beside the steps, never awaited by
    them. Nothing is offered while the run replays (those events were offered when it ran); a sink that
    raises is ignored, since a notifier's fault must never reach the recovery."""

    def __init__(self, status: Callable[[], RunStatus], objectives: dict[str, Any] | None) -> None:
        self._status = status
        self._objectives = objectives
        self._before: Snapshot | None = None

    def offer(self) -> None:
        sink = _sink
        if sink is None:
            return
        after = self._status()
        if not workflow.unsafe.is_replaying():
            for event in run_events(self._before, after, objectives=self._objectives):
                try:
                    sink(event)
                except Exception:  # noqa: BLE001, S110 - see the class docstring
                    pass
        self._before = Snapshot.of(after)

    async def watch(self, since: Callable[[], Callable[[], bool]]) -> None:
        """Offer the events of each change until the run ends; the run offers its last ones itself.
        `since()`: a condition true once the run's status changed from what it is now."""
        if _sink is None:
            return
        while self._before is None or self._before.state in ("running", "paused"):
            changed = since()
            self.offer()
            await workflow.wait_condition(changed)
