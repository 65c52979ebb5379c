"""Drills that cannot hurt: a drill does not start inside a blackout or while a blocking check is red, and one whose
guard turns red mid-run stops and undoes what it did. The target's policy says so; the controller enforces it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from temporalio.client import WorkflowFailureError

from activities.policy import DrillCheck
from runtime.runs import start_run
from tests import support
from workflows.loader import plan_run

PAGES = DrillCheck(name="pages", query='ALERTS{alertstate="firing", severity="page"}')
GUARD = DrillCheck(name="players-ok", query="coldstart:edge_error_ratio > 0.05")


def _book(tmp_path, out):
    return support.write_runbook(tmp_path, f"""
        metadata: {{name: guarded}}
        target: any
        approvers: [alice]
        steps:
          - id: change
            action: test.append
            with: {{path: "{out}", label: changed}}
          - id: soak
            wait: 1m
          - id: after
            action: test.append
            with: {{path: "{out}", label: after}}
    """)


async def _drill(env, task_queue, book, inventory):
    run = plan_run(book, registry=support.registry(), inventory=inventory, initiator="alice", drill=True)
    handle = await start_run(env.client, run, task_queue)
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    return handle, str(failed.value.cause)


async def test_a_drill_does_not_start_in_a_blackout_or_while_a_page_fires(env, task_queue, tmp_path):
    prom = await support.ScriptedPrometheus().start()
    out = tmp_path / "out.txt"
    book = _book(tmp_path, out)
    now = datetime.now(UTC)
    frozen = {"name": f"frozen-{task_queue[-8:]}", "drill": True, "telemetry": {"prometheus": prom.url},
              "policy": {"drills": {"blackouts": [{"start": (now - timedelta(hours=1)).isoformat(),
                                                   "end": (now + timedelta(hours=1)).isoformat(),
                                                   "reason": "release freeze"}]}}}
    paging = {"name": f"paging-{task_queue[-8:]}", "drill": True, "telemetry": {"prometheus": prom.url},
              "policy": {"drills": {"blocking": [PAGES.model_dump()]}}}
    prom.script(PAGES.red_count(), 2)
    try:
        async with support.worker(env.client, task_queue):
            _, frozen_why = await _drill(env, task_queue, book, frozen)
            _, paging_why = await _drill(env, task_queue, book, paging)
            # The same drill on a day without pages starts (and is stopped here, once it has begun, by abort).
            prom.script(PAGES.red_count(), 0)
            run = plan_run(book, registry=support.registry(), inventory=paging, initiator="alice", drill=True)
            handle = await start_run(env.client, run, task_queue)
            await support.wait_for(lambda: _status_is(handle, "soak", "running"), timeout=30)
            await handle.execute_update("abort", {"actor": "alice", "reason": "seen enough"})
    finally:
        await prom.stop()
    assert "not started: inside the blackout" in frozen_why and "(release freeze)" in frozen_why, frozen_why
    assert "not started: blocking check pages is red (2 series above 0" in paging_why, paging_why
    # Only the drill that was allowed to start changed anything.
    assert support.lines(out) == [f"{handle.id} changed"]


async def test_a_red_guard_stops_the_drill_and_undoes_it(env, task_queue, tmp_path):
    prom = await support.ScriptedPrometheus().start()
    out = tmp_path / "out.txt"
    book = _book(tmp_path, out)
    inventory = {"name": f"guarded-{task_queue[-8:]}", "drill": True, "telemetry": {"prometheus": prom.url},
                 "policy": {"drills": {"guard": GUARD.model_dump(), "guard_interval": "1s"}}}
    prom.script(GUARD.red_count(), 0)
    try:
        async with support.worker(env.client, task_queue):
            run = plan_run(book, registry=support.registry(), inventory=inventory, initiator="alice", drill=True)
            handle = await start_run(env.client, run, task_queue)
            await support.wait_for(lambda: _status_is(handle, "soak", "running"), timeout=30)
            prom.script(GUARD.red_count(), 1)
            with pytest.raises(WorkflowFailureError):
                await handle.result()
            status = await support.status(handle)
    finally:
        await prom.stop()
    assert status.state == "aborted", status
    assert status.error and "aborted by drill-guard: guard players-ok red (1 series above 0" in status.error, status.error
    # What the drill changed is undone; the step after the soak never ran.
    assert support.lines(out) == [f"{handle.id} changed", "undo changed"]


async def _status_is(handle, step: str, wanted: str) -> bool:
    # Until the worker has resolved the request the run holds no step yet.
    return next((s.status for s in (await support.status(handle)).steps if s.id == step), None) == wanted
