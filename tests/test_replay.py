"""Recorded histories replay against the current workflow code: no change breaks runs in flight."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

import runtime.worker
from runtime.connection import DATA_CONVERTER
from workflows.fanout import FanOutWorkflow
from workflows.runbook_workflow import RunbookWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


# Production runs the workflows unsandboxed, the tests in the sandbox: a history replays under both.
RUNNERS = {"unsandboxed": runtime.worker.UNSANDBOXED_RUNNER, "sandboxed": runtime.worker.SANDBOXED_RUNNER}


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays(path: Path, runner: str):
    # The id each was recorded under (coldstart-<target>): a run checks its id against its resolved target.
    history = WorkflowHistory.from_json(f"coldstart-replay-{path.stem}", path.read_text())
    replayer = Replayer(workflows=[RunbookWorkflow, FanOutWorkflow], data_converter=DATA_CONVERTER,
                        workflow_runner=RUNNERS[runner])
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


def test_histories_exist_and_cover_the_step_kinds():
    assert {p.stem for p in HISTORIES} >= {"everything", "rollback", "gates", "waited", "resolved", "paced", "batches"}

    def scheduled(name: str) -> list[str]:
        events = json.loads((Path(__file__).parent / "histories" / f"{name}.json").read_text())["events"]
        return [e["activityTaskScheduledEventAttributes"]["activityType"]["name"] for e in events
                if e["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"]

    # Every run's first command resolves its request against the worker's catalog.
    for path in HISTORIES:
        assert scheduled(path.stem)[:1] == ["coldstart.resolve_run"], path.stem
    text = (Path(__file__).parent / "histories" / "everything.json").read_text()
    for marker in ("ramp@30", "each[4]", "healthy/gate/healthy", "approve", "retry"):
        assert marker in text, marker
    # Parallel gates due together are read in batches, their sub-second waits inside the readings (no timers).
    gates = scheduled("gates")
    assert set(gates) == {"coldstart.resolve_run", "telemetry.read_many"}, gates
    waited = json.loads((Path(__file__).parent / "histories" / "waited.json").read_text())
    timers = [base64.b64decode(e["userMetadata"]["summary"]["data"]).decode() for e in waited["events"]
              if e["eventType"] == "EVENT_TYPE_TIMER_STARTED"]
    assert set(timers) <= {'"live view, gathering changes"'}, timers
    reads = [json.loads(base64.b64decode(e["activityTaskScheduledEventAttributes"]["input"]["payloads"][0]["data"]))["reads"]
             for e in waited["events"] if e["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"
             and e["activityTaskScheduledEventAttributes"]["activityType"]["name"] == "telemetry.read_many"]
    assert [{"not_before" in read for read in batch} for batch in reads][:2] == [{False}, {True}], reads
    # A large fan-out runs in child batches, each sealed by a local activity before it starts.
    batches = json.loads((Path(__file__).parent / "histories" / "batches.json").read_text())
    kinds = [e["eventType"] for e in batches["events"]]
    sealed = [e for e in batches["events"] if e["eventType"] == "EVENT_TYPE_MARKER_RECORDED"
              and e["markerRecordedEventAttributes"]["markerName"] == "core_local_activity"]
    children = kinds.count("EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED")
    assert children >= 1 and len(sealed) == children, (children, len(sealed))
