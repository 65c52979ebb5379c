"""Every way in, tried as an attacker with a Temporal client certificate would: a raw client (no CLI) on the
real dev server, against the controller's real worker and catalog. Each case reads the run's history and
asserts that no action activity was scheduled and that the refusal says why.

A canary action (test.append) writes a file; it must never exist. COVERED maps every workflow type, signal
and update the worker registers to the cases that attack it, and a test fails when one has none."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow as temporal_workflow
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import RetryPolicy, SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError

from runtime.catalog import Catalog
from runtime.sealing import SealKeys
from tests import support
from workflows.contract import (
    FanOutInput,
    FleetInput,
    FleetMember,
    ResumeState,
    RunStart,
    SealedFanOut,
    SealedRun,
    drill_schedule_id,
    workflow_id_for,
)
from workflows.fanout import FanOutWorkflow
from workflows.fleet import FleetWorkflow
from workflows.loader import plan_run
from workflows.runbook_workflow import RunbookWorkflow
from workflows.seals import Seal, SealRequest, carried_digest, continuation_place

RUNBOOK = """\
metadata: {name: adversary}
target: prod
approvers: [alice, bob]
steps:
  - id: go
    approval: {prompt: "change it?"}
  - id: change
    action: test.append
    with: {path: "OUT", label: "changed"}
"""

FORGED = """\
metadata: {name: forged}
target: any
steps:
  - id: change
    action: test.append
    with: {path: "OUT", label: "forged"}
"""

# Everything the worker's runs and batches may schedule that is not an action of a runbook.
_CONTROLLER_ACTIVITIES = {"coldstart.resolve_run", "coldstart.identity_keys"}


class Lab:
    """One test's controller: a catalog with a production target, the worker, and the canary file."""

    def __init__(self, client: Client, queue: str, tmp: Path) -> None:
        self.client, self.queue, self.tmp = client, queue, tmp
        self.canary = tmp / "canary.txt"
        runbooks, targets = tmp / "catalog", tmp / "targets"
        runbooks.mkdir()
        targets.mkdir()
        (runbooks / "adversary.yaml").write_text(RUNBOOK.replace("OUT", str(self.canary)))
        self.target = f"prod-{queue}"
        (targets / f"{self.target}.yaml").write_text(
            f"name: {self.target}\ndrill: true\ntelemetry: {{prometheus: 'http://127.0.0.1:9'}}\n")
        self.catalog = Catalog(runbooks, targets)
        self.keys = SealKeys.load(tmp / "seal-keys")
        self.forged_book = tmp / "forged.yaml"
        self.forged_book.write_text(FORGED.replace("OUT", str(self.canary)))

    def worker(self):
        return support.worker(self.client, self.queue, catalog=self.catalog, seal_keys=self.keys)

    def plan(self, book: Path | None = None, **kwargs: Any):
        """A plan as the starter makes it (from its own copy of the catalog's inventory)."""
        return plan_run(book or self.catalog.runbooks_dir / "adversary.yaml", registry=support.registry(),
                        inventory=self.catalog.inventory(self.target), initiator="mallory", **kwargs)

    def forged_plan(self):
        """The attacker's own runbook, planned as if it were the controller's."""
        return self.plan(self.forged_book).model_copy(update={"request": None})


@pytest.fixture
def lab(env, task_queue, tmp_path) -> Lab:
    return Lab(env.client, task_queue, tmp_path)


async def _scheduled(handle: WorkflowHandle) -> list[str]:
    names = []
    async for event in handle.fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            names.append(event.activity_task_scheduled_event_attributes.activity_type.name)
    return names


async def _refused(handle: WorkflowHandle, lab: Lab, *expected: str) -> str:
    """The run ended refused (each `expected` text in its failure), with no action scheduled and no change."""
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), 60)
    message = str(failed.value.cause)
    for text in expected:
        assert text in message, message
    actions = [name for name in await _scheduled(handle) if name not in _CONTROLLER_ACTIVITIES]
    assert actions == [], actions
    assert not lab.canary.exists()
    return message


def _start(lab: Lab, workflow: Any, arg: Any, workflow_id: str | None = None, **options: Any):
    return lab.client.start_workflow(workflow, arg, id=workflow_id or workflow_id_for(lab.target),
                                     task_queue=lab.queue, **options)


# ---- RunbookWorkflow: the door --------------------------------------------------------------------------


async def test_a_forged_plan_in_place_of_a_request_is_refused(lab):
    async with lab.worker():
        handle = await _start(lab, "RunbookWorkflow", lab.forged_plan().model_dump(mode="json"))
        await _refused(handle, lab, "the start input is not a RunStart")


async def test_a_forged_sealed_plan_on_a_new_run_is_refused(lab):
    plan = lab.forged_plan()
    fake = Seal(key_id="k", mac="0" * 64)
    async with lab.worker():
        handle = await _start(lab, RunbookWorkflow.run, RunStart(sealed=SealedRun(plan=plan, seal=fake)))
        await _refused(handle, lab, "handed on by continue-as-new only")


async def test_a_request_and_a_sealed_plan_together_are_refused(lab):
    plan = lab.plan()
    fake = Seal(key_id="k", mac="0" * 64)
    async with lab.worker():
        handle = await _start(lab, RunbookWorkflow.run, RunStart(request=plan.request,
                                                                 sealed=SealedRun(plan=lab.forged_plan(), seal=fake)))
        await _refused(handle, lab, "not both")


async def _each_cron_run_refused(lab: Lab, handle: WorkflowHandle, expected: str) -> None:
    """Wait for two runs of a cron workflow to end, then check each was refused having scheduled no action."""
    runs: list[str] = []
    try:
        async def two_ended() -> bool:
            runs.clear()
            async for found in lab.client.list_workflows(f"WorkflowId = '{handle.id}'"):
                if found.close_time is not None:
                    runs.append(found.run_id)
            return len(runs) >= 2
        await support.wait_for(two_ended, timeout=60, interval=0.5)
    finally:
        await handle.terminate("adversary test over")
    for run_id in runs:
        ended = lab.client.get_workflow_handle(handle.id, run_id=run_id)
        failure = None
        async for event in ended.fetch_history_events():
            if event.HasField("workflow_execution_failed_event_attributes"):
                failure = event.workflow_execution_failed_event_attributes.failure.message
        assert failure is not None and expected in failure, failure
        assert [n for n in await _scheduled(ended) if n not in _CONTROLLER_ACTIVITIES] == []
    assert not lab.canary.exists()


async def test_a_cron_schedule_on_a_run_is_refused_every_time(lab):
    """Temporal repeats a cron run with its first input: each repetition is refused at the door."""
    request = lab.plan(lab.forged_book).request
    async with lab.worker():
        handle = await _start(lab, RunbookWorkflow.run, RunStart(request=request), cron_schedule="@every 2s")
        await _each_cron_run_refused(lab, handle, "never started with a cron schedule")


async def test_a_workflow_retry_policy_on_a_run_is_refused(lab):
    async with lab.worker():
        handle = await _start(lab, RunbookWorkflow.run, RunStart(request=lab.plan().request),
                              retry_policy=RetryPolicy(maximum_attempts=3))
        await _refused(handle, lab, "never started with a workflow retry policy")


async def test_a_request_on_another_targets_id_is_refused(lab):
    async with lab.worker():
        handle = await _start(lab, RunbookWorkflow.run, RunStart(request=lab.plan().request),
                              workflow_id=f"coldstart-elsewhere-{lab.queue}")
        await _refused(handle, lab, "is not target")


async def test_an_id_shaped_like_a_schedules_is_refused(lab):
    """A second, concurrent run on a target by an id a drill Schedule would use, started by a client."""
    request = lab.plan().request
    assert request is not None
    async with lab.worker():
        handle = await _start(lab, RunbookWorkflow.run, RunStart(request=request.model_copy(update={"drill": True})),
                              workflow_id=workflow_id_for(lab.target) + "-2099-01-01T00:00:00Z")
        await _refused(handle, lab, "not started by Schedule")


async def test_an_id_shaped_like_a_schedules_with_the_schedules_mark_set_by_a_client_is_refused(lab):
    """The dev server lets a client set the mark a Schedule puts on its runs: a run is refused unless the mark
    names this target's drill Schedule and the run is a drill (and then only while the target is free)."""
    request = lab.plan().request
    assert request is not None
    mark = TypedSearchAttributes([SearchAttributePair(SearchAttributeKey.for_keyword("TemporalScheduledById"),
                                                      f"someone-else-{lab.queue}")])
    async with lab.worker():
        try:
            handle = await _start(lab, RunbookWorkflow.run, RunStart(request=request),
                                  workflow_id=workflow_id_for(lab.target) + "-2099-01-01T00:00:00Z",
                                  search_attributes=mark)
        except RPCError as exc:
            assert "TemporalScheduledById" in str(exc) or "reserved" in str(exc).lower(), exc
            return
        await _refused(handle, lab, "not started by Schedule")


async def test_a_forged_schedule_mark_gets_no_second_run_on_a_busy_target(lab):
    """Even with the mark naming this target's drill Schedule (the server lets a client set it), a run under a
    schedule-shaped id is refused while the target's run goes on."""
    request = lab.plan().request
    assert request is not None
    mark = TypedSearchAttributes([SearchAttributePair(SearchAttributeKey.for_keyword("TemporalScheduledById"),
                                                      drill_schedule_id("adversary", lab.target))])
    async with lab.worker():
        running = await start_guarded(lab)
        await support.wait_for(lambda: _awaiting(running), timeout=30)
        handle = await _start(lab, RunbookWorkflow.run, RunStart(request=request.model_copy(update={"drill": True})),
                              workflow_id=workflow_id_for(lab.target) + "-2099-01-01T00:00:00Z", search_attributes=mark)
        await _refused(handle, lab, f"target {lab.target} is busy: run {running.id} is still running")
        await running.terminate("adversary test over")


async def test_a_scheduled_drill_holds_its_target_against_a_run_started_meanwhile(lab):
    """Single flight holds across the ids a drill Schedule gives its runs and the target's own."""
    from cli.schedules import schedule_drill

    async with lab.worker():
        schedule = await schedule_drill(lab.client, lab.plan(), lab.queue, "0 0 1 1 *")
        try:
            await schedule.trigger()

            async def drill_run() -> str | None:
                described = await schedule.describe()
                return described.info.running_actions[0].workflow_id if described.info.running_actions else None
            drill_id = await support.wait_for(drill_run, timeout=30)
            drill = lab.client.get_workflow_handle(drill_id)
            await support.wait_for(lambda: _awaiting(drill), timeout=30)
            handle = await start_guarded(lab)
            await _refused(handle, lab, f"is busy: run {drill_id} is still running")
            await drill.terminate("adversary test over")
        finally:
            await schedule.delete()


async def test_a_continuation_replayed_into_a_new_run_is_refused(lab):
    """A real sealed continuation, read from a run's history, started again by a client: the seal holds only
    for the run that sealed it, continued by Temporal."""
    plan = lab.plan()
    resume_from = plan.model_copy(update={"request": None})
    # What a continuation carries: seal it as the worker would for some earlier run of this workflow id.
    resume = ResumeState(next_index=1, steps={}, undo_stack=[], outputs={}, started_at=datetime(2026, 1, 1, tzinfo=UTC))
    carried = resume_from.model_copy(update={"resume": resume})
    place = continuation_place(workflow_id_for(lab.target), str(uuid.uuid4()))
    seal = Seal(key_id=lab.keys.current, mac=lab.keys.mac(lab.keys.current,
                                                         SealRequest(digest=carried_digest(carried), place=place)))
    async with lab.worker():
        handle = await _start(lab, RunbookWorkflow.run, RunStart(sealed=SealedRun(plan=carried, seal=seal)))
        await _refused(handle, lab, "handed on by continue-as-new only")


async def test_a_non_object_start_input_is_refused(lab):
    async with lab.worker():
        handle = await _start(lab, "RunbookWorkflow", {"request": "coldstart please"})
        await _refused(handle, lab, "the start input is not a RunStart")


# ---- FanOutWorkflow: a batch only its parent run may start ---------------------------------------------


def _batch(lab: Lab) -> FanOutInput:
    from workflows.spec import ForEachSpec

    spec = ForEachSpec.model_validate({"items": ["a"], "action": "test.append",
                                       "with": {"path": str(lab.canary), "label": "${{ item }}"}})
    action = lab.plan(lab.forged_book).actions["test.append"]
    return FanOutInput(step_id="each", spec=spec, items=["x", "y"], context={}, action=action)


async def test_a_fan_out_batch_started_by_a_client_is_refused(lab):
    batch = _batch(lab)
    fake = Seal(key_id=lab.keys.current, mac="0" * 64)
    async with lab.worker():
        handle = await _start(lab, FanOutWorkflow.run, SealedFanOut(batch=batch, seal=fake),
                              workflow_id=f"fan-out-{lab.queue}")
        await _refused(handle, lab, "runs only as the child of the run whose step it is")


async def test_a_fan_out_batch_in_the_old_shape_is_refused(lab):
    async with lab.worker():
        handle = await _start(lab, "FanOutWorkflow", _batch(lab).model_dump(mode="json", by_alias=True),
                              workflow_id=f"fan-out-{lab.queue}")
        await _refused(handle, lab, "the start input is not a SealedFanOut")


# ---- FleetWorkflow: members are requests, each resolved at its own run's door ----------------------------


async def test_a_fleet_of_forged_runbooks_runs_none(lab):
    request = lab.plan(lab.forged_book).request
    assert request is not None
    fleet = FleetInput(name=f"f-{lab.queue}", runbook="forged", initiator="mallory",
                       members=[FleetMember(target=lab.target, wave=1, request=request)])
    async with lab.worker():
        handle = await _start(lab, FleetWorkflow.run, fleet, workflow_id=f"coldstart-fleet-{lab.queue}")
        await _refused(handle, lab, "1 of 1 targets did not succeed")
        child = lab.client.get_workflow_handle(workflow_id_for(lab.target))
        await _refused(child, lab, "is not in the controller's catalog")


async def test_a_fleet_member_naming_another_target_is_refused(lab):
    request = lab.plan().request
    assert request is not None
    fleet = FleetInput(name=f"f-{lab.queue}", runbook="adversary", initiator="mallory",
                       members=[FleetMember(target=f"other-{lab.queue}", wave=1, request=request)])
    async with lab.worker():
        handle = await _start(lab, FleetWorkflow.run, fleet, workflow_id=f"coldstart-fleet-{lab.queue}")
        await _refused(handle, lab, f"asks for a run on target {lab.target!r}")


async def test_a_fleet_in_the_old_shape_is_refused(lab):
    plan = lab.forged_plan()
    raw = {"name": "f", "runbook": "forged", "initiator": "mallory",
           "members": [{"target": lab.target, "wave": 1, "run": plan.model_dump(mode="json")}]}
    async with lab.worker():
        handle = await _start(lab, "FleetWorkflow", raw, workflow_id=f"coldstart-fleet-{lab.queue}")
        await _refused(handle, lab, "the start input is not a FleetInput")


async def test_a_fleet_with_a_cron_schedule_is_refused(lab):
    request = lab.plan().request
    assert request is not None
    fleet = FleetInput(name=f"f-{lab.queue}", runbook="adversary", initiator="mallory",
                       members=[FleetMember(target=lab.target, wave=1, request=request)])
    async with lab.worker():
        handle = await _start(lab, FleetWorkflow.run, fleet, workflow_id=f"coldstart-fleet-{lab.queue}",
                              cron_schedule="@every 2s")
        await _each_cron_run_refused(lab, handle, "never started with a cron schedule")


# ---- ReadinessWorkflow: where the worker writes is its own configuration --------------------------------


async def test_readiness_that_chooses_a_file_or_a_url_is_refused(lab):
    raw = {"runbook": "adversary", "target": lab.target, "metrics_file": str(lab.canary),
           "push": "http://127.0.0.1:9/metrics/job/x"}
    async with lab.worker():
        handle = await _start(lab, "ReadinessWorkflow", raw, workflow_id=f"readiness-{lab.queue}")
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), 60)
        assert "metrics_file" in str(failed.value.cause) or "metrics_file" in str(failed.value.cause.__cause__)
    assert not lab.canary.exists()


async def test_readiness_of_a_target_named_by_a_path_is_refused(lab):
    raw = {"runbook": "adversary", "target": "/etc/x"}
    async with lab.worker():
        handle = await _start(lab, "ReadinessWorkflow", raw, workflow_id=f"readiness-{lab.queue}")
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), 60)
    text = f"{failed.value.cause} {failed.value.cause.__cause__}"
    assert "target" in text, text


async def test_a_request_naming_a_target_by_a_path_is_refused(lab):
    request = lab.plan().request
    assert request is not None
    raw = RunStart(request=request).model_dump(mode="json")
    raw["request"]["target"] = str(lab.tmp / "targets" / lab.target)
    async with lab.worker():
        handle = await _start(lab, "RunbookWorkflow", raw)
        await _refused(handle, lab, "target")


# ---- Signals and Updates: forged, replayed and cross-run decisions ----------------------------------------


async def _awaiting(handle: WorkflowHandle) -> bool:
    status = await support.status(handle)
    return "go" in status.awaiting_approval


async def test_every_update_and_signal_from_an_unnamed_actor_changes_nothing(lab):
    """mallory is no approver or operator of this target: every Update is refused by its validator (nothing
    in the history), every Signal is dropped with a note, and the run still waits at its approval."""
    async with lab.worker():
        handle = await start_guarded(lab)
        await support.wait_for(lambda: _awaiting(handle), timeout=30)
        for update in _UPDATES:
            arg = ({"step": "go", "approver": "mallory"} if update == "approve"
                   else {"step": "go", "actor": "mallory"} if update in ("retry", "skip") else {"actor": "mallory"})
            with pytest.raises(WorkflowUpdateFailedError):
                await handle.execute_update(update, arg)
        for signal in _SIGNALS:
            arg = ({"step": "go", "approver": "mallory"} if signal == "approve_signal"
                   else {"step": "go", "actor": "mallory"} if signal in ("retry_signal", "skip_signal")
                   else {"actor": "mallory"})
            await handle.signal(signal, arg)
        for forged in ({"step": "go", "approver": "alice", "identity_token": "a.b.c", "extra": 1},
                       {"step": "../go", "approver": "alice"}, "approve everything"):
            with pytest.raises(WorkflowUpdateFailedError):
                await handle.execute_update("approve", forged)
        await asyncio.sleep(1)
        status = await support.status(handle)
        scheduled = await _scheduled(handle)
        await handle.terminate("adversary test over")
    assert [name for name in scheduled if name not in _CONTROLLER_ACTIVITIES] == [], scheduled
    assert status.state == "running" and status.awaiting_approval == ["go"], status
    assert status.controls == [] and all(not s.approvals for s in status.steps)
    assert not lab.canary.exists()


async def test_an_approval_for_another_run_does_not_carry_over(lab):
    """An approval given to one run is not a decision of the next run on the same target."""
    async with lab.worker():
        first = await start_guarded(lab)
        await support.wait_for(lambda: _awaiting(first), timeout=30)
        await first.terminate("first run over")
        second = await start_guarded(lab)
        await support.wait_for(lambda: _awaiting(second), timeout=30)
        with pytest.raises((WorkflowUpdateFailedError, RPCError)):  # the server refuses an ended run's Updates
            await lab.client.get_workflow_handle(first.id, run_id=first.result_run_id).execute_update(
                "approve", {"step": "go", "approver": "alice"})
        status = await support.status(second)
        scheduled = await _scheduled(second)
        await second.terminate("adversary test over")
    assert [name for name in scheduled if name not in _CONTROLLER_ACTIVITIES] == [], scheduled
    assert status.awaiting_approval == ["go"] and not lab.canary.exists()


async def start_guarded(lab: Lab) -> WorkflowHandle:
    from runtime.runs import start_run

    return await start_run(lab.client, lab.plan(), lab.queue)


# ---- every door has a case -----------------------------------------------------------------------------

_UPDATES = ("approve", "retry", "skip", "abort", "pause", "resume")
_SIGNALS = ("approve_signal", "retry_signal", "skip_signal", "abort_signal", "pause_signal", "resume_signal")

COVERED: dict[str, list[str]] = {
    "workflow:RunbookWorkflow": [
        "test_a_forged_plan_in_place_of_a_request_is_refused",
        "test_a_forged_sealed_plan_on_a_new_run_is_refused",
        "test_a_request_and_a_sealed_plan_together_are_refused",
        "test_a_cron_schedule_on_a_run_is_refused_every_time",
        "test_a_workflow_retry_policy_on_a_run_is_refused",
        "test_a_request_on_another_targets_id_is_refused",
        "test_an_id_shaped_like_a_schedules_is_refused",
        "test_an_id_shaped_like_a_schedules_with_the_schedules_mark_set_by_a_client_is_refused",
        "test_a_forged_schedule_mark_gets_no_second_run_on_a_busy_target",
        "test_a_scheduled_drill_holds_its_target_against_a_run_started_meanwhile",
        "test_a_continuation_replayed_into_a_new_run_is_refused",
        "test_a_non_object_start_input_is_refused",
        "test_a_request_naming_a_target_by_a_path_is_refused",
    ],
    "workflow:FanOutWorkflow": ["test_a_fan_out_batch_started_by_a_client_is_refused",
                                "test_a_fan_out_batch_in_the_old_shape_is_refused"],
    "workflow:FleetWorkflow": ["test_a_fleet_of_forged_runbooks_runs_none",
                               "test_a_fleet_member_naming_another_target_is_refused",
                               "test_a_fleet_in_the_old_shape_is_refused",
                               "test_a_fleet_with_a_cron_schedule_is_refused"],
    "workflow:ReadinessWorkflow": ["test_readiness_that_chooses_a_file_or_a_url_is_refused",
                                   "test_readiness_of_a_target_named_by_a_path_is_refused"],
    **{f"update:RunbookWorkflow.{name}": ["test_every_update_and_signal_from_an_unnamed_actor_changes_nothing",
                                          "test_an_approval_for_another_run_does_not_carry_over"]
       for name in _UPDATES},
    **{f"signal:RunbookWorkflow.{name}": ["test_every_update_and_signal_from_an_unnamed_actor_changes_nothing"]
       for name in _SIGNALS},
}


def test_every_workflow_type_signal_and_update_the_worker_registers_has_an_adversary_case():
    """The worker's own registration, read back: a new workflow type, signal or update fails here until a
    case above attacks it."""
    from runtime.worker import RUN_WORKFLOWS

    doors: set[str] = set()
    for cls in RUN_WORKFLOWS:
        definition = temporal_workflow._Definition.must_from_class(cls)
        assert definition.name is not None
        doors.add(f"workflow:{definition.name}")
        doors |= {f"signal:{definition.name}.{name}" for name in definition.signals if name is not None}
        doors |= {f"update:{definition.name}.{name}" for name in definition.updates if name is not None}
    missing = sorted(doors - set(COVERED))
    assert not missing, f"no adversary case for: {', '.join(missing)}"
    names = {name for name, value in globals().items() if name.startswith("test_") and callable(value)}
    unknown = sorted({case for cases in COVERED.values() for case in cases} - names)
    assert not unknown, unknown
