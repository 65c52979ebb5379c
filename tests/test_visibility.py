"""What the Web UI shows: search attributes, current details with the exact Update to send, summaries; large fan-outs in a child."""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timedelta

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from runtime.connection import DATA_CONVERTER
from runtime.polling import read_kept_status
from runtime.worker import UNSANDBOXED_RUNNER
from tests import support
from workflows.contract import ApproveRequest
from workflows.fanout import FanOutWorkflow
from workflows.history_tags import VIEW_TIMER_SUMMARY
from workflows.runbook_workflow import RunbookWorkflow
from workflows.visibility import VIEW_EVERY


async def _awaiting(handle):
    return "restore" in (await support.status(handle)).awaiting_approval


async def test_search_attributes_and_current_details(env, task_queue, tmp_path):
    book = support.write_runbook(tmp_path, """
        metadata: {name: visible}
        target: t
        approvers: [bob]
        steps:
          - id: restore
            description: Restore the Consul snapshot taken before the incident.
            approval: {prompt: "restore snapshot from 14:05?"}
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue, target={"name": f"vis-{task_queue}"})
        await support.wait_for(lambda: _awaiting(handle))

        async def listed():
            query = f"ColdstartTarget = 'vis-{task_queue}' AND ColdstartAwaitingApproval = true AND ColdstartStep = 'restore'"
            return [w async for w in env.client.list_workflows(query)]

        found = await support.wait_for(listed, timeout=30, interval=0.5)
        assert found[0].id == handle.id

        metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        details = metadata.current_details
        assert "restore snapshot from 14:05?" in details
        assert "Update name: `approve`" in details
        assert json.dumps({"step": "restore", "approver": "bob", "comment": "checked"}) in details
        description = await handle.describe()
        summary = await description.static_summary()
        assert summary and "visible on vis-" in summary
        await handle.execute_update("approve", ApproveRequest(step="restore", approver="bob"))
        await handle.result()


async def test_large_fan_out_runs_in_a_child_workflow(env, task_queue, tmp_path):
    out = tmp_path / "out.txt"
    items = [f"svc{i}" for i in range(150)]
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: big-fan}}
        target: t
        params:
          items: {{type: list, default: {json.dumps(items)}}}
        steps:
          - id: fan
            for_each:
              items: ${{{{ params.items }}}}
              action: test.maybe_fail
              with: {{path: "{out}", label: "${{{{ item }}}}", fail_items: [svc7]}}
              max_concurrency: 20
              error_threshold: "1%"
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        await handle.result()
        status = await support.status(handle)
        child = await env.client.get_workflow_handle(f"{handle.id}/fan/1/1").describe()
    assert child.workflow_type == "FanOutWorkflow"
    assert status.steps[0].outputs["succeeded"] == 149 and status.steps[0].outputs["failed"] == 1
    assert len(support.lines(out)) == 149


async def test_a_fast_run_upserts_its_view_at_most_twice_a_second_and_replays_whatever_its_task_times(env, task_queue, tmp_path):
    """Forty steps of a few ms each would upsert the memo and search attributes forty times; paced, the view
    changes at most once per VIEW_EVERY, a state that lasts (an approval) shows within it, and the end at once."""
    out = tmp_path / "out.txt"
    steps = "".join(f"""
          - id: s{i}
            action: test.append
            with: {{path: "{out}", label: s{i}}}""" for i in range(40))
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: paced}}
        target: t
        approvers: [bob]
        steps:{steps}
          - id: ok
            approval: {{prompt: "go?"}}
          - id: last
            action: test.append
            with: {{path: "{out}", label: last}}
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue, target={"name": f"paced-{task_queue}"})
        # The approval is a state that lasts: the operator's view (the memo, from the server) shows it.
        seen = await support.wait_for(lambda: _memo_awaits(handle, "ok"), timeout=30, interval=0.05)
        assert seen
        await handle.execute_update("approve", ApproveRequest(step="ok", approver="bob"))
        await handle.result()
        history = await handle.fetch_history()
        final = await read_kept_status(handle)
    assert final.state == "succeeded" and all(step.status == "succeeded" for step in final.steps)
    memo = _memo_upserts(history)
    assert 2 <= len(memo) < 20, f"{len(memo)} memo upserts for 42 steps"
    # While the steps ran, each upsert came at least VIEW_EVERY after the one before: it waited for the view's
    # timer, which the server never fires early (unpaced, the steps' 5-50 ms would show). The approval's went
    # out at once, and so did the end.
    asked = next(i for i, (_, keys) in enumerate(memo) if "coldstart.step.ok" in keys)
    gaps = [(b - a).total_seconds() for (a, _), (b, _) in itertools.pairwise(memo[:asked])]
    assert all(gap >= VIEW_EVERY.total_seconds() - 0.05 for gap in gaps), gaps
    # The view waits on timers of its own (summarised), one per upsert at most.
    timers = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
              and VIEW_TIMER_SUMMARY.encode() in e.user_metadata.summary.data]
    assert timers and len(timers) <= len(memo), (len(timers), len(memo))
    # None is cancelled, not even when the approval came inside a window or the run ended inside one: a cancel
    # in the task where the timer fires hung the time-skipping test server (tests/histories/paced.json
    # replays the runs that cancelled).
    view_timers = {e.timer_started_event_attributes.timer_id for e in timers}
    cancelled = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_CANCELED
                 and e.timer_canceled_event_attributes.timer_id in view_timers]
    assert cancelled == [], cancelled
    # Whether the keeper upserts or waits follows from the history's events, not from when its workflow tasks
    # ran: a worker that replays the run with other task times (a task given again after a server restart
    # starts later than the attempt the run's commands came from) takes the same path.
    for shift in (0.0, 0.3, -0.3):
        replayed = await Replayer(workflows=[RunbookWorkflow, FanOutWorkflow], data_converter=DATA_CONVERTER,
                                  workflow_runner=UNSANDBOXED_RUNNER).replay_workflow(
            _tasks_shifted(history, shift), raise_on_replay_failure=False)
        assert replayed.replay_failure is None, (shift, replayed.replay_failure)


def _memo_upserts(history) -> list[tuple[datetime, set[str]]]:
    """(when, which memo keys) for each memo upsert in a run's history."""
    return [(e.event_time.ToDatetime(), set(e.workflow_properties_modified_event_attributes.upserted_memo.fields))
            for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED]


def _tasks_shifted(history: WorkflowHistory, seconds: float) -> WorkflowHistory:
    """The history with every other workflow task's start moved by `seconds` (what a workflow reads as its time)."""
    events = []
    started = 0
    for event in history.events:
        copy = HistoryEvent()
        copy.CopyFrom(event)
        if copy.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            started += 1
            if started % 2 == 0:
                copy.event_time.FromDatetime(copy.event_time.ToDatetime() + timedelta(seconds=seconds))
        events.append(copy)
    return WorkflowHistory(history.workflow_id, events)


async def _memo_awaits(handle, step: str) -> bool:
    return step in (await read_kept_status(handle)).awaiting_approval
