"""What RunbookWorkflow writes into its history for readers: each activity's step as a header, each timer's as a prefix."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Literal

import temporalio.converter
from temporalio import workflow
from temporalio.worker import (
    Interceptor,
    StartActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

__all__ = [
    "ACTIVITY_HEADER",
    "CHAIN_HEADER",
    "VIEW_TIMER_SUMMARY",
    "ActivityTag",
    "HistoryTagInterceptor",
    "activity_tag",
    "approval_note",
    "is_approval_note",
    "tagged",
    "timer_step",
    "timer_summary",
]

# The header on every ActivityTaskScheduled event the workflow produces; plain JSON through the
# SDK's default converter, so any reader (CLI, Web UI, a script) decodes it without our models.
ACTIVITY_HEADER = "coldstart-step"
# The first run id of the run's continue-as-new chain, on every activity: the action journal groups a run's
# attempts by it, so a step repeated across continue-as-new is seen as one.
CHAIN_HEADER = "coldstart-chain"
_TIMER_SEPARATOR = ": "
# The live view's own timer (workflows/visibility.VIEW_EVERY): no step's, no wait of the run's.
VIEW_TIMER_SUMMARY = "live view, gathering changes"
_APPROVAL_FIRST = "awaits approval; "
_APPROVAL_NOTE = "approve with: "
_CONVERTER = temporalio.converter.PayloadConverter.default

Role = Literal["action", "undo", "gate", "ramp", "fan-out", "identity", "resolve"]


@dataclass(frozen=True)
class ActivityTag:
    """Which step an activity works for, and as what."""

    role: Role
    step: str | None = None
    gate: str | None = None
    percent: int | None = None
    item: int | None = None
    # Why the workflow scheduled it again, where it records one: "gate-failed" on a ramp's step-back.
    after: str | None = None


_current: contextvars.ContextVar[ActivityTag | None] = contextvars.ContextVar("coldstart_activity_tag", default=None)


@contextmanager
def tagged(tag: ActivityTag) -> Iterator[None]:
    """Activities scheduled inside this block carry `tag` in their header."""
    token = _current.set(tag)
    try:
        yield
    finally:
        _current.reset(token)


def activity_tag(header: Any) -> ActivityTag | None:
    """The tag of an ActivityTaskScheduled event's header (a temporal.api.common.v1.Header), if it has one."""
    payload = header.fields.get(ACTIVITY_HEADER) if header is not None else None
    if payload is None:
        return None
    data = _CONVERTER.from_payload(payload)
    return ActivityTag(**{k: v for k, v in data.items() if k in ActivityTag.__dataclass_fields__}) if isinstance(data, dict) else None


def timer_summary(step: str, text: str) -> str:
    """A timer's summary: the step first, so the Web UI and the timeline both show whose wait it is."""
    return f"{step}{_TIMER_SEPARATOR}{text}"


def approval_note(step: str, text: str, *, first: bool = False) -> str:
    """A timer's summary that shows how to approve (its first line: who may), not a wait of its own."""
    return timer_summary(step, f"{_APPROVAL_FIRST if first else _APPROVAL_NOTE}{text}")


def is_approval_note(summary: str) -> bool:
    return summary.partition(_TIMER_SEPARATOR)[2].startswith((_APPROVAL_FIRST, _APPROVAL_NOTE))


def timer_step(summary: str) -> str | None:
    step, separator, _ = summary.partition(_TIMER_SEPARATOR)
    return step if separator else None


class HistoryTagInterceptor(Interceptor):
    """Worker interceptor writing the current ActivityTag into each scheduled activity's header."""

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        return _Inbound


class _Inbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_Outbound(outbound))


class _Outbound(WorkflowOutboundInterceptor):
    def start_activity(self, input: StartActivityInput) -> Any:
        tag = _current.get()
        headers = {**input.headers, CHAIN_HEADER: _CONVERTER.to_payload(workflow.info().first_execution_run_id)}
        if tag is not None:
            headers[ACTIVITY_HEADER] = _CONVERTER.to_payload(asdict(tag))
        input.headers = headers
        return super().start_activity(input)
