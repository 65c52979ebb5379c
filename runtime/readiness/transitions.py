"""Readiness turning red (or ready again) between two checks: the event notifications send, and the last states kept."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.readiness.model import Report

__all__ = ["READINESS_EVENTS", "READINESS_STATE_ENV", "LastStates", "offer_transition", "readiness_event"]

READINESS_EVENTS = ("readiness_red", "readiness_ready")
READINESS_STATE_ENV = "COLDSTART_READINESS_STATE"  # where the last state of each runbook and target is kept
_DEFAULT = Path(".state/readiness.json")
_EVIDENCE = 300  # characters of each red check's evidence an event carries


class LastStates:
    """The last readiness state of each runbook on each target, in one small JSON file (written atomically)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or Path(os.environ.get(READINESS_STATE_ENV) or _DEFAULT)

    def _read(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def swap(self, report: Report) -> str | None:
        """Record this report's state; return the one before it (None when never checked). Unknown after not
        ready keeps not ready: a red stands until every check is ready again."""
        states = self._read()
        key = f"{report.runbook}@{report.target}"
        previous = states.get(key)
        states[key] = previous if report.state == "unknown" and previous == "not_ready" else report.state
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(states, indent=1, sort_keys=True))
        os.replace(tmp, self.path)
        return previous


def readiness_event(report: Report, previous: str | None, *, command: str) -> dict[str, Any] | None:
    """`readiness_red` when a check is not ready now and none was before (a first check that is red counts);
    `readiness_ready` when all is ready after a red one; None otherwise (unknown alone pages nobody here: the
    ColdstartReadinessUnknown alert does, after 30 minutes)."""
    if report.state == "not_ready" and previous != "not_ready":
        red = [{"check": r.check, "evidence": r.evidence[:_EVIDENCE]} for r in report.results if r.state == "not_ready"]
        return {"event": "readiness_red", "runbook": report.runbook, "target": report.target, "checks": red,
                "command": command}
    if report.state == "ready" and previous == "not_ready":
        return {"event": "readiness_ready", "runbook": report.runbook, "target": report.target, "checks": [],
                "command": command}
    return None


def offer_transition(report: Report, *, command: str, offer: Callable[[dict[str, Any]], None] | None,
                     states: LastStates | None = None) -> dict[str, Any] | None:
    """Keep this report's state and, when readiness turned red or ready again, hand the event to `offer` (a
    notifier's, which returns at once); the event, or None."""
    event = readiness_event(report, (states or LastStates()).swap(report), command=command)
    if event is not None and offer is not None:
        offer(event)
    return event
