"""The interpreter on a real Temporal dev server: ordering, references, gates, approvals, holds, rollback."""

from __future__ import annotations

import asyncio
import threading

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.worker import (
    HandleUpdateInput,
    Interceptor,
    Replayer,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from runtime.connection import DATA_CONVERTER
from runtime.worker import SANDBOXED_RUNNER, UNSANDBOXED_RUNNER
from tests import support
from workflows.contract import ApproveRequest, ControlRequest, RunResult
from workflows.runbook_workflow import RunbookWorkflow


@pytest.fixture
async def prom():
    server = await support.ScriptedPrometheus().start()
    yield server
    await server.stop()


async def test_steps_run_in_order_and_references_resolve(env, task_queue, tmp_path):
    out = tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: order}}
        target: t
        params:
          who: {{type: string, default: ops}}
        steps:
          - id: first
            action: test.append
            with: {{path: "{out}", label: "first ${{{{ params.who }}}}"}}
          - id: second
            action: test.append
            with: {{path: "{out}", label: "after ${{{{ steps.first.outputs.line }}}}"}}
          - id: pause
            wait: 0.2s
          - id: third
            parallel:
              - id: a
                action: test.append
                with: {{path: "{out}", label: "a"}}
              - id: b
                action: test.append
                with: {{path: "{out}", label: "b"}}
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        result = await handle.result()
    assert isinstance(result, RunResult) and result.state == "succeeded"
    got = support.lines(out)
    assert got[0].endswith("first ops")
    assert got[1].endswith(f"after {got[0]}")
    assert sorted(x.split()[-1] for x in got[2:]) == ["a", "b"]


async def test_gate_passes_after_consecutive_readings(env, task_queue, tmp_path, prom):
    prom.script("q", 5, 0.1, 0.1, 0.1)
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: gatepass}}
        target: t
        steps:
          - id: g
            gate: {{endpoint: "{prom.url}", query: q, comparator: "<", threshold: 1, interval: 0.1s, consecutive: 3, timeout: 20s}}
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        await handle.result()
        status = await support.status(handle)
    readings = status.steps[0].readings
    assert [r.passed for r in readings] == [False, True, True, True]
    assert readings[0].value == 5


async def test_flapping_gate_fails_and_prometheus_down_fails_closed(env, task_queue, tmp_path, prom):
    prom.script("flap", 0, 5, 0, 5, 0, 5, 0, 5, 0, 5, 0, 5, 0, 5, 0, 5, 0, 5, 0, 5, 0, 5, 0, 5, 0, 5)
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: gateflap}}
        target: t
        steps:
          - id: g
            gate: {{endpoint: "{prom.url}", query: flap, comparator: "<", threshold: 1, interval: 0.1s, consecutive: 2, timeout: 1.5s}}
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        assert "not held" in str(failure.value.cause)
        status = await support.status(handle)
        assert status.state == "failed"
        assert any(r.passed for r in status.steps[0].readings)
        assert not all(r.passed for r in status.steps[0].readings)

        prom.down = True
        down_book = support.write_runbook(tmp_path, f"""
            metadata: {{name: gatedown}}
            target: t2
            steps:
              - id: g
                gate: {{endpoint: "{prom.url}", query: q, comparator: ">=", threshold: 0, interval: 0.1s, timeout: 1s}}
        """, name="down")
        handle = await support.start(env.client, down_book, task_queue, target={"name": f"down-{task_queue}"})
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        status = await support.status(handle)
        assert status.steps[0].readings and not any(r.passed for r in status.steps[0].readings)
        assert "503" in (status.steps[0].readings[0].error or "") or "non-JSON" in (status.steps[0].readings[0].error or "")


async def test_approval_rejections_and_four_eyes(env, task_queue, tmp_path):
    out = tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: approve}}
        target: t
        approvers: [alice, bob]
        four_eyes: true
        steps:
          - id: ok
            approval: {{prompt: "restore?"}}
          - id: after
            action: test.append
            with: {{path: "{out}", label: "after"}}
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue, initiator="alice")
        await support.wait_for(lambda: _awaiting(handle, "ok"))
        for req, why in [
            (ApproveRequest(step="nope", approver="bob"), "no step"),
            (ApproveRequest(step="after", approver="bob"), "not awaiting approval"),
            (ApproveRequest(step="ok", approver="mallory"), "may not approve"),
            (ApproveRequest(step="ok", approver="alice"), "four eyes"),
        ]:
            with pytest.raises(WorkflowUpdateFailedError) as rejected:
                await handle.execute_update("approve", req)
            assert why in str(rejected.value.cause)
        record = await handle.execute_update("approve", ApproveRequest(step="ok", approver="bob", comment="looked at it"))
        assert record["approver"] == "bob"
        await handle.result()
        status = await support.status(handle)
    assert status.steps[0].approvals[0].approver == "bob"
    assert status.steps[0].approvals[0].comment == "looked at it"
    assert support.lines(out)[-1].endswith("after")


class _HoldTheUpdatesTask(Interceptor):
    """Keeps the worker inside the workflow task that runs an Update's handler until the test lets it go,
    so the test can land a signal while that task is in flight, as a timer firing or an operator might."""

    def __init__(self) -> None:
        self.entered, self.released = threading.Event(), threading.Event()

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput):
        hold = self

        class _Held(WorkflowInboundInterceptor):
            async def handle_update_handler(self, input: HandleUpdateInput):
                hold.entered.set()
                hold.released.wait(timeout=1.0)  # well under the SDK's 2 s deadlock detector
                return await super().handle_update_handler(input)

        return _Held


@pytest.mark.parametrize("verb", ["approve", "abort"])
async def test_an_update_that_ends_the_run_is_answered_though_an_event_lands_during_its_task(
        env, task_queue, tmp_path, verb):
    """The server refuses a task that ends a run while an event it has not shown the run waits (here a
    signal; in the suite it was the view's timer firing), and answers an Update that task carried with
    "unexpected workflow task failure", not applied. The run answers the Update in one task and ends in
    the next, so the approval or abort lands and the server fails no task."""
    book = support.write_runbook(tmp_path, """
        metadata: {name: last-word}
        target: t
        approvers: [alice]
        steps:
          - id: ok
            approval: {prompt: "go?"}
    """)
    hold = _HoldTheUpdatesTask()
    # Unsandboxed: the sandbox would import this module afresh, and with it events the test cannot set.
    async with support.worker(env.client, task_queue, sandboxed=False, interceptors=[hold]):
        handle = await support.start(env.client, book, task_queue)
        await support.wait_for(lambda: _awaiting(handle, "ok"))
        request = (ApproveRequest(step="ok", approver="alice") if verb == "approve"
                   else ControlRequest(actor="alice", reason="drill over"))
        answer = asyncio.ensure_future(handle.execute_update(verb, request))
        assert await asyncio.to_thread(hold.entered.wait, 10)
        await handle.signal("approve_signal", {"step": "nothing-here", "approver": "alice"})  # refused, harmlessly
        hold.released.set()
        await answer
        if verb == "approve":
            assert (await handle.result()).state == "succeeded"
        else:
            with pytest.raises(WorkflowFailureError) as failure:
                await handle.result()
            assert "aborted by alice: drill over" in str(failure.value.cause)
    history = await handle.fetch_history()
    failed = [e.workflow_task_failed_event_attributes for e in history.events if e.HasField("workflow_task_failed_event_attributes")]
    assert failed == []
    kinds = [e.event_type for e in history.events]
    answered = kinds.index(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED)
    assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED in kinds[answered:]
    # The wait is deterministic: the run's history replays, in the sandbox and out of it.
    for runner in (UNSANDBOXED_RUNNER, SANDBOXED_RUNNER):
        replayer = Replayer(workflows=[RunbookWorkflow], data_converter=DATA_CONVERTER, workflow_runner=runner)
        assert (await replayer.replay_workflow(history, raise_on_replay_failure=False)).replay_failure is None


async def _awaiting(handle, step):
    status = await support.status(handle)
    return step in status.awaiting_approval


async def _held(handle, step):
    status = await support.status(handle)
    return step in status.held


async def test_hold_then_retry_skip_or_abort(env, task_queue, tmp_path):
    out = tmp_path / "out.txt"
    flag = tmp_path / "fixed"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: hold}}
        target: t
        approvers: [op]
        steps:
          - id: flaky
            action: test.maybe_fail
            with: {{path: "{out}", label: flaky, fail_until_file_exists: "{flag}"}}
            on_failure: hold
          - id: after
            action: test.append
            with: {{path: "{out}", label: after}}
    """)
    async with support.worker(env.client, task_queue):
        # retry after the fault is fixed
        handle = await support.start(env.client, book, task_queue, target={"name": "hold-retry-" + task_queue})
        await support.wait_for(lambda: _held(handle, "flaky"))
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update("retry", ControlRequest(step="after", actor="op"))
        flag.touch()
        await handle.execute_update("retry", ControlRequest(step="flaky", actor="op", reason="fixed"))
        await handle.result()
        assert support.lines(out)[0] == "flaky"
        flag.unlink()

        # skip
        handle = await support.start(env.client, book, task_queue, target={"name": "hold-skip-" + task_queue})
        await support.wait_for(lambda: _held(handle, "flaky"))
        await handle.execute_update("skip", ControlRequest(actor="op"))
        await handle.result()
        status = await support.status(handle)
        assert [s.status for s in status.steps] == ["skipped", "succeeded"]

        # abort
        handle = await support.start(env.client, book, task_queue, target={"name": "hold-abort-" + task_queue})
        await support.wait_for(lambda: _held(handle, "flaky"))
        await handle.execute_update("abort", ControlRequest(actor="op", reason="giving up"))
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        assert "aborted by op" in str(failure.value.cause)


async def test_an_abort_says_what_it_leaves_changed_or_undoes_it(env, task_queue, tmp_path):
    """An abort mid-recovery (the client block in place, the restore held) either names what it leaves
    changed, with the action that would revert it, or, asked to, undoes it newest first."""
    out = tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: aborted}}
        target: t
        operators: [op]
        steps:
          - id: block
            action: test.append
            with: {{path: "{out}", label: block}}
          - id: restore
            action: test.maybe_fail
            with: {{path: "{out}", label: restore, fail_items: [restore]}}
            on_failure: hold
    """)
    async with support.worker(env.client, task_queue):
        kept = await support.start(env.client, book, task_queue, target={"name": "abort-keep-" + task_queue})
        await support.wait_for(lambda: _held(kept, "restore"))
        await kept.execute_update("abort", ControlRequest(actor="op", reason="wrong snapshot"))
        with pytest.raises(WorkflowFailureError) as failure:
            await kept.result()
        assert "left in place, not undone: block (test.append_undo)" in str(failure.value.cause)
        assert [line.split()[-1] for line in support.lines(out)] == ["block"]  # nothing was undone
        undone = await support.start(env.client, book, task_queue, target={"name": "abort-undo-" + task_queue})
        await support.wait_for(lambda: _held(undone, "restore"))
        await undone.execute_update("abort", ControlRequest(actor="op", reason="wrong snapshot", undo=True))
        with pytest.raises(WorkflowFailureError) as failure:
            await undone.result()
        assert "rolled back: block" in str(failure.value.cause)
        assert (await support.status(undone)).state == "aborted"
    assert support.lines(out)[-1] == "undo block"


async def test_rollback_runs_undo_in_reverse(env, task_queue, tmp_path):
    out = tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: rollback}}
        target: t
        steps:
          - id: one
            action: test.append
            with: {{path: "{out}", label: one}}
          - id: two
            action: test.append
            with: {{path: "{out}", label: two}}
            undo:
              action: test.append_undo
              with: {{path: "{out}", label: "two (was ${{{{ steps.two.outputs.line }}}})"}}
          - id: boom
            action: test.maybe_fail
            with: {{path: "{out}", label: boom, fail_items: [boom]}}
            on_failure: rollback
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
    got = support.lines(out)
    assert got[2].startswith("undo two (was ")
    assert got[3] == "undo one"
    assert "rolled back: two, one" in str(failure.value.cause)


async def test_fan_out_error_threshold(env, task_queue, tmp_path):
    out = tmp_path / "out.txt"
    items = [f"s{i}" for i in range(20)]
    body = f"""
        metadata: {{name: fanout}}
        target: t
        params:
          items: {{type: list, default: {items}}}
          bad: {{type: list, default: [s3, s7]}}
          threshold: {{type: string, default: "10%"}}
        steps:
          - id: fan
            for_each:
              items: ${{{{ params.items }}}}
              as: svc
              action: test.maybe_fail
              with: {{path: "{out}", label: "${{{{ svc }}}}", fail_items: "${{{{ params.bad }}}}"}}
              max_concurrency: 4
              error_threshold: ${{{{ params.threshold }}}}
    """
    book = support.write_runbook(tmp_path, body)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue, target={"name": "fan-ok-" + task_queue})
        result = await handle.result()
        status = await support.status(handle)
        assert status.steps[0].outputs["failed"] == 2 and status.steps[0].outputs["succeeded"] == 18
        handle = await support.start(env.client, book, task_queue, target={"name": "fan-bad-" + task_queue},
                                     params={"bad": ["s1", "s2", "s3"]})
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        assert "more than the 2 allowed" in str(failure.value.cause)
    del result


async def test_ramp_steps_back_holds_and_resumes_after_retry(env, task_queue, tmp_path, prom):
    out = tmp_path / "out.txt"
    prom.script("errors", 0, 0, 5, 0)  # 10 and 20 pass; 30 fails; the fallback reading at 20 passes
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: ramping}}
        target: t
        operators: [op]
        steps:
          - id: ramp
            ramp:
              action: test.append
              with: {{path: "{out}", label: "${{{{ ramp.percent }}}} from ${{{{ ramp.previous }}}}"}}
              start: 10
              stop: 50
              step: 10
              bake: 0.1s
              gates:
                - {{name: errors, endpoint: "{prom.url}", query: errors, comparator: "<", threshold: 1, interval: 1s, timeout: 0.5s}}
                - {{name: seen, endpoint: "{prom.url}", query: "seen ${{{{ ramp.percent }}}}", comparator: "<", threshold: 2,
                   interval: 1s, timeout: 0.5s}}
    """)
    # The timeout is shorter than the interval: exactly one reading per percentage.
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        held = await support.wait_for(lambda: _held_status(handle, "ramp"))
        ramp = held.steps[0]
        assert ramp.percent == 20 and ramp.last_good == 20
        assert "stepped back to 20%" in ramp.error and "gates at 20%: passing" in ramp.error
        assert [line.split(" ", 1)[1] for line in support.lines(out)] == [
            "10 from 0", "20 from 10", "30 from 20", "20 from 30"]
        prom.script("errors", 0)
        await handle.execute_update("retry", ControlRequest(step="ramp", actor="op", reason="db index added"))
        await handle.result()
    assert [line.split(" ", 1)[1] for line in support.lines(out)][4:] == ["30 from 20", "40 from 30", "50 from 40"]
    # Gates resolve ${{ ramp.percent }} per step, and at the step back to the fallback percentage.
    assert [c for c in prom.calls if c.startswith("seen")] == ["seen 10", "seen 20", "seen 20", "seen 30", "seen 40",
                                                               "seen 50"]


async def _held_status(handle, step):
    status = await support.status(handle)
    return status if step in status.held else None
