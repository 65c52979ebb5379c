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
    assert {p.stem for p in HISTORIES} >= {"everything", "rollback", "gates", "waited", "resolved", "paced"}
    # resolved.json was recorded since runs are resolved against the worker's catalog, rollback.json before.
    for name, first in (("resolved", ["coldstart.resolve_run"]), ("rollback", [])):
        events = json.loads((Path(__file__).parent / "histories" / f"{name}.json").read_text())["events"]
        scheduled = [e["activityTaskScheduledEventAttributes"]["activityType"]["name"] for e in events
                     if e["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"]
        assert [t for t in scheduled if t == "coldstart.resolve_run"] == first and scheduled[: len(first)] == first
    text = (Path(__file__).parent / "histories" / "everything.json").read_text()
    for marker in ("ramp@30", "each[4]", "healthy/gate/healthy", "approve", "retry"):
        assert marker in text, marker
    # everything.json was recorded before readings were batched, gates.json after.
    assert "telemetry.read_many" not in text
    gates = json.loads((Path(__file__).parent / "histories" / "gates.json").read_text())
    types = [e["activityTaskScheduledEventAttributes"]["activityType"]["name"] for e in gates["events"]
             if e["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"]
    assert types and set(types) == {"telemetry.read_many"}, types
    # gates.json was recorded when sub-second waits were timers, waited.json since they are waited in the readings.
    assert "EVENT_TYPE_TIMER_STARTED" in json.dumps(gates)
    waited = json.loads((Path(__file__).parent / "histories" / "waited.json").read_text())
    assert "EVENT_TYPE_TIMER_STARTED" not in json.dumps(waited)
    reads = [json.loads(base64.b64decode(e["activityTaskScheduledEventAttributes"]["input"]["payloads"][0]["data"]))["reads"]
             for e in waited["events"] if e["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"]
    assert [{"not_before" in read for read in batch} for batch in reads][:2] == [{False}, {True}], reads
