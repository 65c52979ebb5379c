"""What the Web UI shows: search attributes, current details with the exact Update to send, summaries; large fan-outs in a child."""

from __future__ import annotations

import itertools
import json
from datetime import datetime

from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata

from runtime.polling import read_kept_status
from tests import support
from workflows.contract import ApproveRequest
from workflows.history_tags import VIEW_TIMER_SUMMARY
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


def _view_upserts(history) -> list[tuple[datetime, str]]:
    """(when, which) for each memo and search-attributes upsert in a run's history."""
    kinds = {EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED: "memo",
             EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES: "search attributes"}
    return [(e.event_time.ToDatetime(), kinds[e.event_type]) for e in history.events if e.event_type in kinds]


async def test_a_fast_run_upserts_its_view_at_most_twice_a_second_and_its_end_at_once(env, task_queue, tmp_path):
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
    upserts = _view_upserts(history)
    memo = [at for at, kind in upserts if kind == "memo"]
    assert 2 <= len(memo) < 20, f"{len(memo)} memo upserts for 42 steps"
    # Each upsert but the end's came at least VIEW_EVERY after the one before (less the workflow task that
    # made it: the pace is kept in workflow time, a task's start); unpaced, the steps' 5-50 ms would show.
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(memo)]
    assert all(gap >= VIEW_EVERY.total_seconds() - 0.2 for gap in gaps[:-1]), gaps
    # The view waits on timers of its own (summarised), one per upsert it deferred at most.
    timers = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
              and VIEW_TIMER_SUMMARY.encode() in e.user_metadata.summary.data]
    assert timers and len(timers) <= len(memo), (len(timers), len(memo))


async def _memo_awaits(handle, step: str) -> bool:
    return step in (await read_kept_status(handle)).awaiting_approval
