"""The door's checks a workflow makes itself: how it was started, and the seals on what it was handed.

The workflow side only digests (pure, deterministic); sealing and verifying run as local activities on the
worker (runtime/sealing.py), whose results the history records, so a replay needs no key."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from workflows.seals import (
    SEAL_ACTIVITY,
    VERIFY_SEAL_ACTIVITY,
    Seal,
    SealRequest,
    carried_digest,
    continuation_place,
    fan_out_place,
    received_digest,
)

__all__ = ["continuation_place", "fan_out_place", "seal", "start_refusal", "verify"]


def start_refusal(kind: str) -> str | None:
    """Why this run may not start the way it was started, or None. Temporal repeats a run on its own for a
    cron schedule and a workflow retry policy, each time with the first input again: a run's repetition is a
    Temporal Schedule's (which starts each run afresh at the door), never the starter's."""
    info = workflow.info()
    if info.cron_schedule:
        return (f"a {kind} is never started with a cron schedule ({info.cron_schedule!r}): repeat it with a Temporal "
                "Schedule (coldstart schedule)")
    if info.retry_policy is not None:
        return f"a {kind} is never started with a workflow retry policy: its steps retry by their own policies"
    return None


async def seal(model: BaseModel, place: str) -> Seal:
    """The worker's seal over `model` for `place`."""
    sealed = await workflow.execute_local_activity(
        SEAL_ACTIVITY, SealRequest(digest=carried_digest(model), place=place), result_type=Seal,
        start_to_close_timeout=timedelta(seconds=10), retry_policy=RetryPolicy(maximum_attempts=3),
        summary=f"seal {place}"[:200])
    return sealed


async def verify(model: BaseModel, given: Seal, place: str) -> str | None:
    """None when `given` is a worker's seal over `model` for `place`; otherwise why not (one line)."""
    try:
        await workflow.execute_local_activity(
            VERIFY_SEAL_ACTIVITY, SealRequest(digest=received_digest(model), place=place, seal=given),
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=["SealRefused"]),
            summary=f"verify {place}"[:200])
    except ActivityError as exc:
        cause = exc.cause
        return getattr(cause, "message", None) or str(cause or exc)
    return None
