"""Starting and finding runs: workflow ids derived from the target give single flight per target."""

from __future__ import annotations

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from activities.errors import Refused
from workflows import search
from workflows.contract import RunInput, RunStart, workflow_id_for
from workflows.runbook_workflow import RunbookWorkflow

__all__ = ["TargetBusy", "start_run", "workflow_id_for"]


class TargetBusy(Refused):
    """Another run holds the target."""


async def start_run(client: Client, run: RunInput, task_queue: str, *,
                    identity_token: str | None = None) -> WorkflowHandle:
    """Start a run, refusing when the target already has one running (whatever its runbook). `identity_token`:
    the starter's, bound to this request (cli.identity.start_source), for targets that verify who starts."""
    workflow_id = workflow_id_for(run.target_name)
    if run.request is None:
        raise Refused(f"run of {run.runbook.metadata.name} on {run.target_name}: the plan carries no request "
                      "(plan it with workflows.loader.plan_run)")
    request = run.request
    if identity_token is not None:
        request = request.model_copy(update={"identity_token": identity_token})
    attributes = search.for_new_run(run.runbook.metadata.name, run.target_name, run.drill)
    try:
        return await client.start_workflow(
            RunbookWorkflow.run,
            # The request alone: the worker resolves it against its own catalog; nothing else is taken.
            RunStart(request=request),
            id=workflow_id,
            task_queue=task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            search_attributes=attributes,
            static_summary=f"{run.runbook.metadata.name} on {run.target_name} by {run.initiator}",
            static_details=run.runbook.metadata.description,
        )
    except WorkflowAlreadyStartedError:
        pass
    handle = client.get_workflow_handle(workflow_id)
    description = await handle.describe()
    if description.status != WorkflowExecutionStatus.RUNNING:
        # Finished between our attempt and the describe: one more try is enough.
        return await start_run(client, run, task_queue, identity_token=identity_token)
    busy = description.typed_search_attributes
    raise TargetBusy(
        f"target {run.target_name} is busy: run {workflow_id} (run id {description.run_id}, "
        f"runbook {busy.get(search.RUNBOOK) or '?'}, started {description.start_time:%Y-%m-%d %H:%M:%S}Z) is still running"
    )
