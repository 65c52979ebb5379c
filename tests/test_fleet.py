"""Fleet-wide runs: one child run per target in waves, a concurrency limit, stop or continue on failure,
single flight per target kept, approvals per target, and the CLI's combined status and timeline."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowFailureError

from cli.fleet import FleetInvalid, plan_fleet, start_fleet, wave_of
from tests import support
from tests.test_cli import acli
from workflows.contract import ApproveRequest, ControlRequest, FleetStatus, workflow_id_for
from workflows.loader import plan_run


def _plan(book: Path, params: dict | None = None):
    """plan_one for plan_fleet: each target's run against its own (test-unique) inventory."""
    return lambda target: plan_run(book, registry=support.registry(), inventory={"name": target},
                                   initiator="tester", params=params)


def _targets(task_queue: str, *names: str) -> list[str]:
    # Targets are global on the shared dev server (single flight): unique per test.
    return [f"{name}-{task_queue[-8:]}" for name in names]


async def _fleet_status(handle) -> FleetStatus:
    return await handle.query("status", result_type=FleetStatus)


def _book(tmp_path: Path, out: Path, *, fail: bool = False, approval: bool = False, settle: str = "0s") -> Path:
    steps = f"""
          - id: work
            action: {"test.maybe_fail" if fail else "test.append"}
            with: {{path: "{out}", label: "${{{{ run.target }}}}"{', fail_items: "${{ params.fail }}"' if fail else ''}}}
          - id: settle
            wait: {settle}
    """
    if approval:
        steps += """
          - id: go
            approval: {prompt: "go on this target?"}
        """
    params = "params:\n  fail: {type: list, default: []}\n" if fail else ""
    return support.write_runbook(tmp_path, f"metadata: {{name: fleet-test}}\ntarget: x\napprovers: [bob]\n{params}"
                                           f"steps:{steps}")


def test_waves_are_sizes_in_target_order_and_the_rest_is_one_wave() -> None:
    assert wave_of(["a", "b", "c", "d"], [1, 2]) == {"a": 1, "b": 2, "c": 2, "d": 3}
    assert wave_of(["a", "b"], None) == {"a": 1, "b": 1}
    assert wave_of(["a", "b", "c"], [1, 2]) == {"a": 1, "b": 2, "c": 2}
    for targets, waves, says in ((["a", "b"], [3], "covers 3 targets"), (["a", "b"], [0, 1], "at least 1"),
                                 (["a", "a"], None, "names a target twice")):
        with pytest.raises(FleetInvalid, match=says):
            wave_of(targets, waves)


async def test_waves_run_in_order_and_each_target_gets_its_own_run(env, task_queue, tmp_path):
    out = tmp_path / "executions.txt"
    book = _book(tmp_path, out, settle="1s")
    a, b, c = _targets(task_queue, "a", "b", "c")
    fleet = plan_fleet(_plan(book), [a, b, c], [1], name=f"f-{task_queue}", initiator="tester",
                       max_parallel=0, on_failure="stop")
    async with support.worker(env.client, task_queue):
        handle = await start_fleet(env.client, fleet, task_queue)
        result = await handle.result()
        # Each child is the ordinary run of its target (same workflow id: single flight shared with single runs).
        for member in result.members:
            child = env.client.get_workflow_handle(workflow_id_for(member.target), run_id=member.run_id)
            assert (await support.status(child)).state == "succeeded"
    assert result.state == "succeeded"
    members = {m.target: m for m in result.members}
    assert [members[t].wave for t in (a, b, c)] == [1, 2, 2]
    # The canary wave ended before the next one started; the second wave's two ran side by side.
    assert members[a].ended_at <= min(members[b].started_at, members[c].started_at)
    assert _overlap(members[b], members[c])
    assert sorted(support.lines(out)) == sorted(f"{workflow_id_for(t)} {t}" for t in (a, b, c))
    assert support.lines(out)[0].endswith(f" {a}")


def _overlap(one, other) -> bool:
    return one.started_at < other.ended_at and other.started_at < one.ended_at


async def test_a_failed_wave_stops_the_fleet_unless_told_to_continue(env, task_queue, tmp_path):
    out = tmp_path / "executions.txt"
    book = _book(tmp_path, out, fail=True)
    a, b, c = _targets(task_queue, "a", "b", "c")
    async with support.worker(env.client, task_queue):
        stopping = plan_fleet(_plan(book, params={"fail": [a]}), [a, b, c], [1],
                              name=f"stop-{task_queue}", initiator="tester", max_parallel=0, on_failure="stop")
        handle = await start_fleet(env.client, stopping, task_queue)
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
        assert "3 of 3 targets did not succeed" in str(failed.value.cause)  # a failed; b and c were skipped
        status = await _fleet_status(handle)
        assert {m.target: m.state for m in status.members} == {a: "failed", b: "skipped", c: "skipped"}
        assert "injected failure" in (status.members[0].error or "")
        assert support.lines(out) == []

        # Continue on failure, one at a time: b fails in the only wave, a and c still run, never two at once.
        going_on = plan_fleet(_plan(book, params={"fail": [b]}), [a, b, c], None,
                              name=f"go-{task_queue}", initiator="tester", max_parallel=1, on_failure="continue")
        handle = await start_fleet(env.client, going_on, task_queue)
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        status = await _fleet_status(handle)
    states = {m.target: m.state for m in status.members}
    assert states == {a: "succeeded", b: "failed", c: "succeeded"}
    assert status.state == "failed" and b in (status.error or "")
    spans = sorted(status.members, key=lambda m: m.started_at)
    assert all(earlier.ended_at <= later.started_at for earlier, later in itertools.pairwise(spans))
    assert sorted(line.split()[-1] for line in support.lines(out)) == sorted([a, c])


async def test_a_busy_target_is_not_run_twice_and_approvals_stay_per_target(env, task_queue, tmp_path):
    out = tmp_path / "executions.txt"
    book = _book(tmp_path, out, approval=True)
    a, b = _targets(task_queue, "a", "b")
    async with support.worker(env.client, task_queue):
        # A single run already holds b (waiting for its approval).
        single = await support.start(env.client, book, task_queue, target={"name": b})
        await support.wait_for(lambda: _awaiting(single, "go"))
        fleet = plan_fleet(_plan(book), [a, b], None, name=f"busy-{task_queue}", initiator="tester",
                           max_parallel=0, on_failure="continue")
        handle = await start_fleet(env.client, fleet, task_queue)
        child = env.client.get_workflow_handle(workflow_id_for(a))
        await support.wait_for(lambda: _awaiting(child, "go"))
        status = await _fleet_status(handle)
        assert {m.target: m.state for m in status.members} == {a: "running", b: "busy"}
        # Approving a's run is done on a's run, as for any run; the fleet waits for it.
        await child.execute_update("approve", ApproveRequest(step="go", approver="bob"))
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        status = await _fleet_status(handle)
        assert {m.target: m.state for m in status.members} == {a: "succeeded", b: "busy"}
        assert "already running" in (status.members[1].error or "")
        await single.execute_update("abort", ControlRequest(actor="bob", reason="test over"))
    # b's work ran once, for the single run; the fleet did not start b again.
    assert sorted(line.split()[-1] for line in support.lines(out)) == sorted([a, b])


async def _awaiting(handle, step):
    try:
        return step in (await support.status(handle)).awaiting_approval
    except Exception:  # noqa: BLE001 - not started yet
        return False


async def test_cli_runs_a_fleet_and_shows_its_combined_status_and_timeline(env, task_queue, tmp_path):
    journal = tmp_path / "journal.jsonl"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: fleet-cli}}
        target: x
        steps:
          - id: work
            action: core.note
            with: {{message: "on ${{{{ run.target }}}}", journal: "{journal}"}}
    """)
    targets = tmp_path / "targets"
    targets.mkdir()
    a, b = _targets(task_queue, "a", "b")
    for name in (a, b):
        (targets / f"{name}.yaml").write_text(f"name: {name}\ntelemetry: {{prometheus: 'http://127.0.0.1:9'}}\n")
    env_vars = {"TEMPORAL_ADDRESS": env.client.service_client.config.target_host, "COLDSTART_TASK_QUEUE": task_queue,
                "COLDSTART_TARGETS": str(targets), "COLDSTART_USER": "alice"}
    name = f"cli-{task_queue[-8:]}"
    refused = await acli(env_vars, "run", str(book), "--targets", f"{a},nope-{task_queue[-8:]}")
    assert refused.returncode == 2 and "nope" in refused.stderr  # one unknown target: nothing starts
    refused = await acli(env_vars, "run", str(book), "--targets", a, "--waves", "2")
    assert refused.returncode == 2 and "covers 2 targets" in refused.stderr
    async with support.worker(env.client, task_queue):
        started = await acli(env_vars, "run", str(book), "--targets", f"{a},{b}", "--waves", "1",
                             "--fleet-name", name, "--json")
        assert started.returncode == 0, started.stderr
        assert [m["wave"] for m in json.loads(started.stdout)["members"]] == [1, 2]
        await env.client.get_workflow_handle(json.loads(started.stdout)["workflow_id"]).result()
        shown = await acli(env_vars, "status", f"fleet-{name}", "--json")
        assert shown.returncode == 0, shown.stderr
        current = json.loads(shown.stdout)
        assert current["state"] == "succeeded" and set(current["runs"]) == {a, b}
        assert all(run["state"] == "succeeded" for run in current["runs"].values())
        table = await acli(env_vars, "status", f"fleet-{name}")
        assert a in table.stdout and "succeeded" in table.stdout
        told = await acli(env_vars, "timeline", f"fleet-{name}")
        assert told.returncode == 0, told.stderr
    assert f"## wave 1: {a} (succeeded)" in told.stdout and f"## wave 2: {b} (succeeded)" in told.stdout
    assert told.stdout.count("work") >= 2  # each member's own timeline, with its steps

