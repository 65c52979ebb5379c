"""How the workflow calls an action: one tagged activity with its pinned timeout and retry, a failure as StepFailed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy
from temporalio.exceptions import ActivityError

from activities.errors import ColdstartError

with workflow.unsafe.imports_passed_through():
    from activities.retry import Retry
    from workflows.history_tags import ActivityTag, tagged
    from workflows.refs import iter_refs, split_path
    from workflows.spec import ActionDefaults

__all__ = ["READING_PRIORITY", "DeadlineMissed", "RunAborted", "StepFailed", "call_action", "compare", "execute_action", "failure_message", "referenced", "retry_policy"]


# Task queue priority (1 first, 3 by default): a gate reading is a poll that comes again, so in a
# backlog other work goes first; its fairness key is its run, so one run's flood of readings cannot
# starve another run's gates (the server honours keys with matching.enableFairness on).
READING_PRIORITY = 4


class StepFailed(ColdstartError):
    def __init__(self, message: str, *, rollback: bool = False):
        super().__init__(message)
        self.rollback = rollback


class DeadlineMissed(StepFailed):
    """A step could not finish before its deadline: it is neither held nor retried."""


class RunAborted(ColdstartError):
    pass


def compare(value: float, comparator: str, threshold: float) -> bool:
    return {
        "<": value < threshold,
        "<=": value <= threshold,
        ">": value > threshold,
        ">=": value >= threshold,
        "==": value == threshold,
        "!=": value != threshold,
    }[comparator]


def failure_message(exc: BaseException) -> str:
    """The innermost cause's message: what the activity itself said went wrong."""
    current: BaseException | None = exc
    message = str(exc)
    while current is not None:
        if str(current):
            message = str(current)
        current = current.__cause__
    return message


def retry_policy(retry: Retry) -> RetryPolicy:
    """A runbook's retry shape as Temporal's policy (the contract side stays free of the SDK)."""
    return RetryPolicy(
        initial_interval=retry.initial_interval,
        backoff_coefficient=retry.backoff,
        maximum_interval=retry.max_interval,
        maximum_attempts=retry.max_attempts,
    )


async def call_action(
    action: ActionDefaults,
    args: dict[str, Any],
    *,
    activity_id: str,
    summary: str,
    tag: ActivityTag,
    timeout: timedelta | None = None,
    retry: Retry | None = None,
    priority: Priority | None = None,
    task_queue: str | None = None,
) -> Any:
    """One activity for `action` with its pinned timeout and retry, tagged; ActivityError if it failed."""
    # Scheduled inside the block, awaited outside it: the tag's context must not span the await (a run
    # evicted mid-activity closes the coroutine from another context, where the reset would fail).
    with tagged(tag):
        handle = workflow.start_activity(
            action.name,
            args,
            activity_id=activity_id,
            start_to_close_timeout=timeout or action.timeout,
            heartbeat_timeout=action.heartbeat,
            retry_policy=retry_policy(retry or action.retry),
            summary=summary[:400],
            priority=priority or Priority.default,
            task_queue=task_queue,
        )
    return await handle


async def execute_action(action: ActionDefaults, args: dict[str, Any], **call: Any) -> dict[str, Any]:
    """call_action for a step: its outputs as a mapping, a failure as StepFailed naming the action."""
    try:
        result = await call_action(action, args, **call)
    except ActivityError as exc:
        raise StepFailed(f"{action.name}: {failure_message(exc)}") from None
    if result is None:
        return {}
    return result if isinstance(result, dict) else {"value": result}


def referenced(context: dict[str, Any], value: Any) -> dict[str, Any]:
    """Only the parts of the context that `value` refers to: a fan-out's input stays small
    (otherwise a list of 1,000 items would travel twice, once as items and once inside params)."""
    kept: dict[str, Any] = {}
    for ref in iter_refs(value):
        parts = split_path(ref)
        root = parts[0]
        if root not in context:
            continue
        if len(parts) > 1 and isinstance(context[root], dict) and root in ("params", "steps", "target"):
            name = parts[1]
            if name in context[root]:
                kept.setdefault(root, {})[name] = context[root][name]
        else:
            kept[root] = context[root]
    return kept
