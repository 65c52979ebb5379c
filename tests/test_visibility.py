"""What the Web UI shows: search attributes, current details with the exact Update to send, summaries; large fan-outs in a child."""

from __future__ import annotations

import json

from temporalio.api.sdk.v1 import WorkflowMetadata

from tests import support
from workflows.contract import ApproveRequest


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
