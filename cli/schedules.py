"""Temporal Schedules: game-day drills (a runbook started on a cron, always as a drill) and readiness checks."""

from __future__ import annotations

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleHandle,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
    ScheduleUpdate,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from activities.errors import Refused
from runtime.runs import workflow_id_for
from workflows import search
from workflows.contract import RunInput, RunStart, drill_schedule_id
from workflows.names import check_name
from workflows.readiness import ReadinessRequest, ReadinessWorkflow, readiness_schedule_id
from workflows.runbook_workflow import RunbookWorkflow

__all__ = ["DrillTargetRefused", "schedule_drill", "schedule_id_for", "schedule_readiness"]


class DrillTargetRefused(Refused):
    """The target is not marked as a drill target."""


def schedule_id_for(runbook: str, target: str) -> str:
    """The drill schedule's id; NameRefused unless both are names (workflows/names.py)."""
    return drill_schedule_id(check_name('runbook', runbook), check_name('target', target))


async def schedule_drill(client: Client, run: RunInput, task_queue: str, cron: str, *, paused: bool = False) -> ScheduleHandle:
    """Create (or replace) the schedule; overlapping drills are skipped, never queued."""
    if not run.target.get("drill"):
        raise DrillTargetRefused(f"target {run.target_name} is not marked as a drill target (drill: true); refusing to schedule a drill")
    if run.request is None:
        raise DrillTargetRefused(f"drill of {run.runbook.metadata.name} on {run.target_name}: the plan carries no request")
    request = run.request.model_copy(update={"drill": True})
    run = run.model_copy(update={"drill": True, "request": request})
    schedule_id = schedule_id_for(run.runbook.metadata.name, run.target_name)
    schedule = Schedule(
        action=ScheduleActionStartWorkflow(
            RunbookWorkflow.run,
            RunStart(request=request),
            # Temporal appends the scheduled time to this id; SKIP keeps one drill at a time.
            id=workflow_id_for(run.target_name),
            task_queue=task_queue,
            typed_search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(search.RUNBOOK, run.runbook.metadata.name),
                    SearchAttributePair(search.TARGET, run.target_name),
                    SearchAttributePair(search.CURRENT_STEP, "starting"),
                    SearchAttributePair(search.AWAITING_APPROVAL, False),
                    SearchAttributePair(search.DRILL, True),
                ]
            ),
        ),
        spec=ScheduleSpec(cron_expressions=[cron]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
        state=ScheduleState(paused=paused, note=f"game-day drill of {run.runbook.metadata.name} on {run.target_name}"),
    )
    return await _create_or_replace(client, schedule_id, schedule)


async def schedule_readiness(client: Client, request: ReadinessRequest, task_queue: str, cron: str, *,
                             paused: bool = False) -> ScheduleHandle:
    """Create (or replace) the schedule that checks `request` on a worker of `task_queue`; one check at a time."""
    schedule_id = readiness_schedule_id(request.runbook, request.target)
    schedule = Schedule(
        # As JSON: the workflow validates what it is given itself (workflows/readiness.readiness_request).
        action=ScheduleActionStartWorkflow(ReadinessWorkflow.run, request.model_dump(mode="json"), id=schedule_id,
                                           task_queue=task_queue),
        spec=ScheduleSpec(cron_expressions=[cron]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
        state=ScheduleState(paused=paused, note=f"readiness of {request.runbook} on {request.target}"),
    )
    return await _create_or_replace(client, schedule_id, schedule)


async def _create_or_replace(client: Client, schedule_id: str, schedule: Schedule) -> ScheduleHandle:
    try:
        return await client.create_schedule(schedule_id, schedule)
    except ScheduleAlreadyRunningError:
        handle = client.get_schedule_handle(schedule_id)
        await handle.update(lambda _: ScheduleUpdate(schedule=schedule))
        return handle
