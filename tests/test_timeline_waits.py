"""The timeline keeps waiting time (issue 38 item 3): every step that ran is in the step table, wait steps too,
its wall time split into working and waiting (an approval, a hold, a timer) with who ended each wait; holds and
approvals are events with their durations; the steps plus the time between them add up to the run's wall time."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime

from cli.timeline import Timeline, _Waits
from tests import support
from tests.test_cli import acli


async def _step_status(handle, step: str) -> str:
    state = await support.status(handle)
    return next((s.status for s in state.steps if s.id == step), None)  # no step before the request is resolved


# How long the test keeps the gate's hold and the approval waiting after it sees each: lower bounds on what the
# timeline says they lasted (timing upper bounds belong to bench/).
HOLD_KEPT_S = 2.0
APPROVAL_HELD_S = 2.5


async def _until(handle, step: str, wanted: str) -> float:
    """Poll the run's status until `step` is `wanted`; the monotonic time it was first seen so."""

    async def seen() -> bool:
        return await _step_status(handle, step) == wanted

    await support.wait_for(seen, timeout=30, interval=0.05)
    return time.monotonic()


async def test_timeline_keeps_holds_approvals_and_waits(env, task_queue, tmp_path):
    prom = await support.ScriptedPrometheus().start()
    try:
        await _run_and_read(env, task_queue, tmp_path, prom)
    finally:
        await prom.stop()


async def _run_and_read(env, task_queue, tmp_path, prom) -> None:
    prom.script("ready_up", 0)  # the gate fails until the test fixes it
    target = f"waits-{task_queue[-8:]}"
    book = support.write_runbook(tmp_path, """
        metadata: {name: waits, owner: sre}
        target: any
        approvers: [alice, bob, carol]
        steps:
          - id: hello
            action: core.note
            with: {message: hello}
          - id: ready
            gate: {name: up, endpoint: "${{ target.telemetry.prometheus }}", query: ready_up, comparator: ">=", threshold: 1, interval: 0.2s, consecutive: 1, timeout: 1s}
            on_failure: hold
          - id: go
            approval: {prompt: "carry on?"}
          - id: settle
            wait: 1s
          - id: bye
            action: core.note
            with: {message: bye}
    """)
    inventory = {"name": target, "telemetry": {"prometheus": prom.url}}
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue, target=inventory, initiator="alice")
        held_seen = await _until(handle, "ready", "held")
        await asyncio.sleep(HOLD_KEPT_S)
        prom.script("ready_up", 1)
        await handle.execute_update("retry", {"actor": "carol", "step": "ready", "reason": "prometheus fixed"})
        held_for = time.monotonic() - held_seen
        asked_seen = await _until(handle, "go", "awaiting_approval")
        await asyncio.sleep(APPROVAL_HELD_S)
        await handle.execute_update("approve", {"step": "go", "approver": "bob", "comment": "looks good"})
        approval_delay = time.monotonic() - asked_seen
        await handle.result()

    env_vars = {"TEMPORAL_ADDRESS": env.client.service_client.config.target_host, "COLDSTART_USER": "alice"}
    told = await acli(env_vars, "timeline", target, "--format", "json")
    assert told.returncode == 0, told.stderr
    data = json.loads(told.stdout)
    steps = {s["step"]: s for s in data["steps"]}
    # Every step that ran is in the table, the wait step included, in the order they ran.
    assert [s["step"] for s in data["steps"]] == ["hello", "ready", "go", "settle", "bye"]
    assert all(abs(s["working_s"] + s["waiting_s"] - s["duration_s"]) < 1e-6 for s in steps.values())

    # The approval step waited for bob at least as long as the test held it back (it was asked before the test
    # saw it asked, and answered after the test sent bob's approval), and waiting is most of that step.
    go = steps["go"]
    assert go["kind"] == "approval"
    assert go["waiting_s"] >= APPROVAL_HELD_S and go["working_s"] < go["waiting_s"], (go, approval_delay)
    [approval] = go["waits"]
    assert (approval["kind"], approval["how"], approval["ended_by"]) == ("approval", "approved", "bob")

    # The gate's hold: its duration, and carol's retry ended it.
    ready = steps["ready"]
    holds = [w for w in ready["waits"] if w["kind"] == "hold"]
    assert len(holds) == 1 and (holds[0]["how"], holds[0]["ended_by"]) == ("retry", "carol"), ready
    hold_s = (datetime.fromisoformat(holds[0]["ended"]) - datetime.fromisoformat(holds[0]["started"])).total_seconds()
    assert hold_s >= HOLD_KEPT_S, (hold_s, held_for)
    # In the server's time: the hold ended (carol's retry) before the approval was asked.
    assert datetime.fromisoformat(holds[0]["ended"]) <= datetime.fromisoformat(approval["started"]), (holds, approval)
    assert abs(ready["waiting_s"] - hold_s) < 1e-6
    assert ready["readings"] >= 2 and ready["failed_readings"] == 0  # readings of 0 are values, not errors

    # The wait step: waiting on its timer, which fired.
    settle = steps["settle"]
    assert settle["kind"] == "wait" and [(w["kind"], w["how"]) for w in settle["waits"]] == [("timer", "fired")]
    # Its 1 s timer; the step ends with the workflow task after it fires (how soon after is a bench's question).
    assert 0.9 <= settle["waiting_s"] <= settle["duration_s"], settle

    # The events say the same, with durations and who ended each wait.
    events = data["entries"]
    ended_hold = [e for e in events if e["event"] == "hold ended"]
    assert len(ended_hold) == 1 and ended_hold[0]["actor"] == "carol" and ended_hold[0]["outcome"] == "retry"
    assert abs(ended_hold[0]["duration_s"] - hold_s) < 1e-6
    assert [e["step"] for e in events if e["event"] == "held"] == ["ready"]
    asked = [e for e in events if e["event"] == "approval requested"]
    answered = [e for e in events if e["event"] == "approval wait ended"]
    assert [e["detail"] for e in asked] == ["carry on?"]
    assert len(answered) == 1 and answered[0]["actor"] == "bob" and abs(answered[0]["duration_s"] - go["waiting_s"]) < 1e-6

    # The steps plus the time between them are the run's wall time, first event to close.
    wall = (datetime.fromisoformat(data["ended"]) - datetime.fromisoformat(data["started"])).total_seconds()
    totals = data["totals"]
    assert abs(totals["wall_s"] - wall) < 1e-6
    assert abs(totals["steps_s"] + totals["between_s"] - wall) < 1.0, totals
    own_sum = sum(s["duration_s"] + s["gap_before_s"] for s in data["steps"] if not s["nested"])
    last_end = max(datetime.fromisoformat(s["ended"]) for s in data["steps"])
    own_sum += (datetime.fromisoformat(data["ended"]) - last_end).total_seconds()
    assert abs(own_sum - wall) < 1.0, (own_sum, wall)
    assert wall > approval_delay + held_for + 1.0

    markdown = await acli(env_vars, "timeline", target)
    assert markdown.returncode == 0, markdown.stderr
    text = markdown.stdout
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert {"hello", "ready", "go", "settle", "bye", "**total**"} <= set(rows), text
    assert "approval " in rows["go"] and "(approved by bob)" in rows["go"], rows["go"]
    assert "(retry by carol)" in rows["ready"] and "(fired)" in rows["settle"], text
    assert f"run wall time (first event to close) {wall:.2f} s." in text, text


def test_a_chunk_of_steps_tells_the_timeline_only_what_changed_in_it() -> None:
    # A skipped step's entry has no end: sent again beside a step that changed, its end must not move.
    timeline = Timeline(workflow_id="w", run_ids=["r"])
    waits = _Waits(timeline)
    t0, t1, t2 = (datetime(2026, 1, 1, 0, 0, s) for s in (0, 10, 20))
    skipped = {"id": "skip", "kind": "action", "status": "skipped"}
    waits.upserted(t0, {"coldstart.steps.0": [skipped, None]})
    waits.upserted(t1, {"coldstart.step.gate": {"position": 1, "id": "gate", "kind": "gate", "status": "held",
                                                "started_at": "2026-01-01T00:00:05Z", "error": "errors high"},
                        "coldstart.steps.0": [skipped, None]})
    waits.upserted(t2, {"coldstart.step.gate": None,
                        "coldstart.steps.0": [skipped, {"id": "gate", "kind": "gate", "status": "succeeded",
                                                        "started_at": "2026-01-01T00:00:05Z",
                                                        "ended_at": "2026-01-01T00:00:18Z"}]})
    assert timeline.steps["skip"].ended == t0
    assert timeline.steps["gate"].status == "succeeded" and timeline.steps["gate"].ended == datetime(2026, 1, 1, 0, 0, 18)
    assert [(e.step, e.event) for e in timeline.entries] == [("gate", "held"), ("gate", "hold ended")]
