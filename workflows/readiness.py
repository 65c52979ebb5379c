"""ReadinessWorkflow: a scheduled readiness check, run by a worker as one activity; the report is its result."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from workflows.names import RunbookName, TargetName

__all__ = ["READINESS_ACTIVITY", "ReadinessRequest", "ReadinessWorkflow", "readiness_request", "readiness_schedule_id"]

READINESS_ACTIVITY = "coldstart.readiness"


class ReadinessRequest(BaseModel):
    """Which runbook (by name, from the worker's catalog) on which target (by name, its inventory from the same
    catalog), with which parameters. Nothing else: whoever can start a workflow or edit a Schedule writes this,
    so where the report's metrics go is the worker's own configuration (runtime/readiness/scheduled.py), and a
    field the request does not have is refused."""

    model_config = ConfigDict(extra="forbid")

    runbook: RunbookName
    target: TargetName
    params: dict[str, Any] = Field(default_factory=dict)
    timeout_seconds: float = Field(default=10.0, gt=0, le=600)
    trial_restore: bool = False


def readiness_request(raw: Any) -> ReadinessRequest:
    """`raw` as a ReadinessRequest, or a non-retryable ApplicationError saying in one line what is refused."""
    if isinstance(raw, ReadinessRequest):
        return raw
    if not isinstance(raw, dict):
        raise ApplicationError(f"readiness request refused: a JSON object is expected, not {type(raw).__name__}",
                               type="InvalidInput", non_retryable=True)
    try:
        return ReadinessRequest.model_validate(raw)
    except ValidationError as exc:
        reasons = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"]) or "(the request)"
            if error["type"] == "extra_forbidden":
                reasons.append(f"{where} is not a readiness request field")
            elif error["type"] == "value_error" and "error" in (context := error.get("ctx", {})):
                reasons.append(" ".join(str(context["error"]).split()))  # a name's own line names its field
            else:
                reasons.append(f"{where}: {' '.join(str(error['msg']).split())}")
        # Bounded: a request may carry any number of fields, and its refusal is one line.
        more = f" (and {len(reasons) - 5} more)" if len(reasons) > 5 else ""
        raise ApplicationError(f"readiness request refused: {'; '.join(reasons[:5])}{more}", type="InvalidInput",
                               non_retryable=True) from None


def readiness_schedule_id(runbook: str, target: str) -> str:
    return f"readiness-{runbook}-{target}"


@workflow.defn
class ReadinessWorkflow:
    @workflow.run
    async def run(self, raw: dict[str, Any]) -> dict[str, Any]:
        # Taken as JSON and validated here: a request the worker does not take fails this run with the reason,
        # where a typed argument would fail every workflow task in the decoder and hold the Schedule's next runs.
        request = readiness_request(raw)
        # One attempt: the next scheduled check is the retry, and a stale answer would read as a current one.
        return await workflow.execute_activity(
            READINESS_ACTIVITY, request, result_type=dict,
            start_to_close_timeout=timedelta(seconds=max(request.timeout_seconds, 300.0) + 60),
            retry_policy=RetryPolicy(maximum_attempts=1))
