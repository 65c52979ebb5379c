"""ReadinessWorkflow: a scheduled readiness check, run by a worker as one activity; the report is its result."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy

__all__ = ["READINESS_ACTIVITY", "ReadinessRequest", "ReadinessWorkflow", "readiness_schedule_id"]

READINESS_ACTIVITY = "coldstart.readiness"


class ReadinessRequest(BaseModel):
    """Which runbook (by name, from the worker's catalog) on which target, and where its metrics go on the worker."""

    runbook: str
    target: str
    params: dict[str, Any] = Field(default_factory=dict)
    timeout_seconds: float = Field(default=10.0, gt=0, le=600)
    metrics_file: str | None = None
    push: str | None = None
    trial_restore: bool = False


def readiness_schedule_id(runbook: str, target: str) -> str:
    return f"readiness-{runbook}-{target}"


@workflow.defn
class ReadinessWorkflow:
    @workflow.run
    async def run(self, request: ReadinessRequest) -> dict[str, Any]:
        # One attempt: the next scheduled check is the retry, and a stale answer would read as a current one.
        return await workflow.execute_activity(
            READINESS_ACTIVITY, request, result_type=dict,
            start_to_close_timeout=timedelta(seconds=max(request.timeout_seconds, 300.0) + 60),
            retry_policy=RetryPolicy(maximum_attempts=1))
