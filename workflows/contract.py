"""Workflow inputs, operator requests and the status a run reports: the data crossing Temporal."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from workflows.spec import ActionDefaults, ForEachSpec, RetrySpec, Runbook

__all__ = [
    "ApprovalRecord",
    "ApproveRequest",
    "ControlRequest",
    "FanOutInput",
    "FanOutResult",
    "GateReading",
    "ReadGateInput",
    "RunInput",
    "RunResult",
    "RunStatus",
    "StepState",
    "StepStatus",
    "UndoRecord",
]

StepStatus = Literal[
    "pending",
    "running",
    "awaiting_approval",
    "held",
    "succeeded",
    "failed",
    "skipped",
    "rolled_back",
    "aborted",
]


class GateReading(BaseModel):
    """One sample of a gate: the value read, whether it passed, or why there is no value."""

    gate: str
    at: datetime
    value: float | None = None
    passed: bool = False
    error: str | None = None
    percent: int | None = None


class ReadGateInput(BaseModel):
    """Input of the telemetry.read activity."""

    source: Literal["prometheus", "http"]
    endpoint: str
    query: str = ""
    timeout_seconds: float = 10.0


class ApprovalRecord(BaseModel):
    step: str
    approver: str
    comment: str = ""
    at: datetime
    percent: int | None = None


class UndoRecord(BaseModel):
    """An undo action computed when its step completed, run in reverse order on rollback."""

    step: str
    action: str
    args: dict[str, Any]


class StepState(BaseModel):
    id: str
    kind: str
    title: str = ""
    status: StepStatus = "pending"
    started_at: datetime | None = None
    ended_at: datetime | None = None
    attempts: int = 0
    outputs: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    readings: list[GateReading] = Field(default_factory=list)
    approvals: list[ApprovalRecord] = Field(default_factory=list)
    percent: int | None = None
    last_good: int | None = None
    awaiting: str | None = None


class RunInput(BaseModel):
    """Everything a run needs, validated and with start-time references resolved."""

    runbook: Runbook
    source: str
    params: dict[str, Any] = Field(default_factory=dict)
    target: dict[str, Any] = Field(default_factory=dict)
    target_name: str
    initiator: str
    drill: bool = False
    actions: dict[str, ActionDefaults] = Field(default_factory=dict)
    # Carried across continue-as-new.
    resume: "ResumeState | None" = None


class ResumeState(BaseModel):
    next_index: int
    steps: dict[str, StepState]
    undo_stack: list[UndoRecord]
    outputs: dict[str, dict[str, Any]]
    paused: bool = False
    started_at: datetime


class RunStatus(BaseModel):
    workflow_id: str
    runbook: str
    target: str
    initiator: str
    drill: bool
    state: Literal["running", "paused", "succeeded", "failed", "aborted", "rolled_back"]
    current_step: str | None = None
    awaiting_approval: list[str] = Field(default_factory=list)
    held: list[str] = Field(default_factory=list)
    started_at: datetime
    ended_at: datetime | None = None
    steps: list[StepState]
    error: str | None = None


class RunResult(BaseModel):
    state: Literal["succeeded", "failed", "aborted", "rolled_back"]
    steps: list[StepState]
    error: str | None = None


class ApproveRequest(BaseModel):
    """Update `approve`: the approver takes responsibility for the step going ahead."""

    step: str
    approver: str
    comment: str = ""


class ControlRequest(BaseModel):
    """Updates retry/skip/abort/pause/resume: who asks, for which step, and why."""

    step: str | None = None
    actor: str
    reason: str = ""


class FanOutInput(BaseModel):
    """A for_each fan-out handed to a child workflow when it is large."""

    step_id: str
    spec: ForEachSpec
    items: list[Any]
    context: dict[str, Any]
    action: ActionDefaults
    attempt: int = 1


class FanOutResult(BaseModel):
    total: int
    succeeded: int
    failed: int
    failures: list[str] = Field(default_factory=list)
    results: list[Any] = Field(default_factory=list)


RunInput.model_rebuild()
_ = RetrySpec
