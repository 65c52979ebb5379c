"""FleetWorkflow: one runbook on many targets, a child run per target, wave after wave."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError, ChildWorkflowError, WorkflowAlreadyStartedError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from workflows import search
    from workflows.calls import failure_message
    from workflows.contract import (
        FleetInput,
        FleetMember,
        FleetMemberState,
        FleetState,
        FleetStatus,
        RunResult,
        RunStart,
        parsed_start,
        workflow_id_for,
    )
    from workflows.sealing import start_refusal

__all__ = ["FleetWorkflow", "fleet_workflow_id"]

# The child is the ordinary run, started by name: the fleet adds ordering, not another interpreter.
_RUN_WORKFLOW = "RunbookWorkflow"


def fleet_workflow_id(name: str) -> str:
    """One fleet run per name at a time, beside the per-target ids its children hold."""
    return workflow_id_for(f"fleet-{name}")


def _members_refusal(inp: FleetInput) -> str | None:
    """Why the fleet's members do not make a fleet of `inp.runbook`, or None."""
    for member in inp.members:
        if member.request.target != member.target:
            return f"member {member.target!r} asks for a run on target {member.request.target!r}"
        if member.request.runbook != inp.runbook:
            return f"member {member.target!r} asks for runbook {member.request.runbook!r}, not {inp.runbook!r}"
    if len({m.target for m in inp.members}) != len(inp.members):
        return "a target is named twice"
    return None


@workflow.defn
class FleetWorkflow:
    """Starts each target's run as a child with the id a single run on that target would have, so single
    flight per target holds across fleet and single runs; approvals and controls stay per target (each
    child is a RunbookWorkflow with its own Updates). A wave starts when the previous one has ended."""

    @workflow.init
    def __init__(self, start: FleetInput | dict[str, Any]) -> None:
        parsed, self._malformed = parsed_start(FleetInput, start)
        inp = parsed or FleetInput.model_construct(name="unresolved", runbook="", initiator="", members=[],
                                                   max_parallel=0, on_failure="stop")
        self._inp = inp
        self._members = {
            m.target: FleetMemberState(target=m.target, wave=m.wave, workflow_id=workflow_id_for(m.target))
            for m in inp.members
        }
        self._state: FleetState = "running"
        self._wave: int | None = None
        self._error: str | None = None
        self._started_at = workflow.now()
        self._ended_at = None

    @workflow.run
    async def run(self, start: FleetInput | dict[str, Any]) -> FleetStatus:
        inp = self._inp
        refusal = self._malformed or start_refusal("fleet run") or _members_refusal(inp)
        if refusal is not None:
            self._state, self._error, self._ended_at = "failed", refusal, workflow.now()
            raise ApplicationError(f"fleet {inp.name} refused by the controller: {refusal}", type="FleetRefused",
                                   non_retryable=True)
        waves = sorted({m.wave for m in inp.members})
        stopped_after: int | None = None
        for wave in waves:
            members = [m for m in inp.members if m.wave == wave]
            if stopped_after is not None:
                for member in members:
                    self._end(member.target, "skipped", f"not started: wave {stopped_after} had a failed run")
                continue
            self._wave = wave
            self._describe()
            limiter = asyncio.Semaphore(inp.max_parallel or len(members))
            await asyncio.gather(*(self._run_member(member, limiter) for member in members))
            if inp.on_failure == "stop" and any(self._members[m.target].state in ("failed", "busy") for m in members):
                stopped_after = wave
        self._wave = None
        self._ended_at = workflow.now()
        failed = [s for s in self._members.values() if s.state in ("failed", "busy", "skipped")]
        self._state = "failed" if failed else "succeeded"
        if failed:
            self._error = "; ".join(f"{s.target}: {s.state}" + (f" ({s.error})" if s.error else "") for s in failed[:10])
        self._describe()
        status = self.status()
        if failed:
            raise ApplicationError(f"fleet {inp.name}: {len(failed)} of {len(inp.members)} targets did not succeed: "
                                   f"{self._error}", status.model_dump(mode="json"), type="FleetFailed",
                                   non_retryable=True)
        return status

    async def _run_member(self, member: FleetMember, limiter: asyncio.Semaphore) -> None:
        state = self._members[member.target]
        async with limiter:
            state.state, state.started_at = "running", workflow.now()
            self._describe()
            request = member.request
            try:
                child = await workflow.start_child_workflow(
                    _RUN_WORKFLOW,
                    # The member's run resolves its request against the catalog at its own door.
                    RunStart(request=request),
                    id=state.workflow_id,
                    result_type=RunResult,
                    # A recovery already under way on a target outlives the fleet that started it: it has its
                    # own approvals and controls, and cancelling it halfway is an operator's decision.
                    parent_close_policy=ParentClosePolicy.ABANDON,
                    search_attributes=search.for_new_run(request.runbook, request.target, request.drill),
                    static_summary=f"{request.runbook} on {request.target} (fleet {self._inp.name}, "
                                   f"wave {member.wave})",
                )
            except WorkflowAlreadyStartedError:
                self._end(member.target, "busy", f"target busy: {state.workflow_id} is already running")
                return
            state.run_id = child.first_execution_run_id
            try:
                await child
            except ChildWorkflowError as exc:
                self._end(member.target, "failed", failure_message(exc))
                return
            self._end(member.target, "succeeded")

    def _end(self, target: str, outcome: Any, error: str | None = None) -> None:
        state = self._members[target]
        state.state, state.error, state.ended_at = outcome, error, workflow.now()
        workflow.logger.info("fleet member ended", extra={"target": target, "state": outcome, "error": error})
        self._describe()

    def _describe(self) -> None:
        # The Web UI shows this beside the run: who is where, each target's run id to open its approvals.
        lines = [f"**fleet {self._inp.name}**: {self._inp.runbook}, wave {self._wave or '-'}, {self._state}", ""]
        lines += [f"- wave {s.wave} `{s.workflow_id}`: {s.state}" + (f" ({s.error})" if s.error else "")
                  for s in self._members.values()]
        workflow.set_current_details("\n".join(lines))

    @workflow.query
    def status(self) -> FleetStatus:
        return FleetStatus(
            workflow_id=workflow.info().workflow_id,
            name=self._inp.name,
            runbook=self._inp.runbook,
            initiator=self._inp.initiator,
            state=self._state,
            wave=self._wave,
            max_parallel=self._inp.max_parallel,
            on_failure=self._inp.on_failure,
            members=list(self._members.values()),
            started_at=self._started_at,
            ended_at=self._ended_at,
            error=self._error,
        )
