"""Fleet-wide runs from the CLI: plan one run per target, start the fleet, show its combined status and timeline."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from activities.errors import InvalidInput
from runtime.polling import read_full_status, read_kept_status
from runtime.runs import TargetBusy
from workflows import search
from workflows.contract import FleetInput, FleetMember, FleetOnFailure, FleetStatus, RunInput, RunStatus
from workflows.fleet import FleetWorkflow, fleet_workflow_id
from workflows.names import NameRefused, check_name

__all__ = ["FleetInvalid", "combined_timeline", "plan_fleet", "render_status", "start_fleet", "wave_of"]


class FleetInvalid(InvalidInput):
    """The targets and waves do not make a fleet (one line)."""


def wave_of(targets: list[str], waves: list[int] | None) -> dict[str, int]:
    """Each target's wave: `waves` are the sizes of the first waves in target order (1,2 = a canary, then two);
    targets past them form one last wave. No waves: one wave of every target."""
    for target in targets:
        try:
            check_name("target", target)
        except NameRefused as exc:
            raise FleetInvalid(f"--targets: {exc}") from None
    if len(set(targets)) != len(targets):
        raise FleetInvalid(f"--targets names a target twice: {', '.join(t for t in targets if targets.count(t) > 1)}")
    sizes = list(waves or [])
    if any(size < 1 for size in sizes):
        raise FleetInvalid(f"--waves sizes must be at least 1, got {','.join(map(str, sizes))}")
    if sum(sizes) > len(targets):
        raise FleetInvalid(f"--waves {','.join(map(str, sizes))} covers {sum(sizes)} targets, but --targets names "
                           f"{len(targets)}")
    if sum(sizes) < len(targets):
        sizes.append(len(targets) - sum(sizes))
    assigned: dict[str, int] = {}
    remaining = iter(targets)
    for wave, size in enumerate(sizes, start=1):
        for _ in range(size):
            assigned[next(remaining)] = wave
    return assigned


def plan_fleet(plan_one: Callable[[str], RunInput], targets: list[str], waves: list[int] | None, *,
               name: str | None, initiator: str, max_parallel: int, on_failure: FleetOnFailure) -> FleetInput:
    """Plan every target's run before anything starts: one invalid target stops the whole fleet (plan_one
    raises what the loader raises for it)."""
    assigned = wave_of(targets, waves)
    members = []
    for target, wave in assigned.items():
        request = plan_one(target).request
        if request is None:
            raise FleetInvalid(f"target {target}: the plan carries no request to start")
        members.append(FleetMember(target=target, wave=wave, request=request))
    runbooks = {m.request.runbook for m in members}
    runbook = runbooks.pop()
    return FleetInput(name=name or runbook, runbook=runbook, initiator=initiator, members=members,
                      max_parallel=max_parallel, on_failure=on_failure)


async def start_fleet(client: Client, fleet: FleetInput, task_queue: str) -> WorkflowHandle:
    """Start the fleet; refused while a fleet of the same name runs (its children hold their targets anyway)."""
    workflow_id = fleet_workflow_id(fleet.name)
    try:
        return await client.start_workflow(
            FleetWorkflow.run,
            fleet,
            id=workflow_id,
            task_queue=task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            search_attributes=search.for_new_run(fleet.runbook, f"fleet:{fleet.name}", False),
            static_summary=f"fleet {fleet.name}: {fleet.runbook} on {len(fleet.members)} targets by {fleet.initiator}",
        )
    except WorkflowAlreadyStartedError:
        raise TargetBusy(f"fleet {fleet.name} is busy: {workflow_id} is still running") from None


async def member_runs(client: Client, status: FleetStatus, *, outputs: bool = False) -> dict[str, RunStatus]:
    """Each started member's own run status (its current step, approvals awaited): the one it keeps in
    its memo, read from the server, or with `outputs` all of it (cli/polling.read_full_status)."""
    found: dict[str, RunStatus] = {}
    for member in status.members:
        if member.run_id is None:
            continue
        handle = client.get_workflow_handle(member.workflow_id, run_id=member.run_id)
        try:
            found[member.target] = await (read_full_status(handle, attempts=1) if outputs
                                          else read_kept_status(handle, attempts=1))
        except Exception:  # noqa: BLE001, S112 - a member whose worker is gone still shows its fleet state
            continue
    return found


def render_status(console: Console, status: FleetStatus, runs: dict[str, RunStatus]) -> None:
    console.print(f"[bold]fleet {status.name}[/bold]: {status.runbook} by {status.initiator}, {status.state}"
                  + (f", wave {status.wave}" if status.wave else "")
                  + f" (max parallel {status.max_parallel or 'whole wave'}, on failure {status.on_failure})")
    table = Table("wave", "target", "fleet state", "run", "step", "awaiting")
    for member in status.members:
        run = runs.get(member.target)
        table.add_row(str(member.wave), member.target, member.state + (f": {member.error}" if member.error else ""),
                      member.workflow_id, (run.current_step or run.state) if run else "-",
                      ", ".join(run.awaiting_approval + run.held) if run else "")
    console.print(table)
    if status.error:
        console.print(f"[red]{status.error}[/red]")


async def combined_timeline(client: Client, status: FleetStatus, build: Callable[..., Any],
                            render: Callable[[Any], str]) -> str:
    """One Markdown timeline: the fleet's members in wave order, each run's own timeline under it."""
    parts = [f"# fleet {status.name}: {status.runbook} ({status.state})", ""]
    for member in status.members:
        parts.append(f"## wave {member.wave}: {member.target} ({member.state})")
        if member.error:
            parts.append(f"\n{member.error}\n")
        if member.run_id is not None:
            parts.append(render(await build(client, member.workflow_id, member.run_id)))
        parts.append("")
    return "\n".join(parts)
