"""Durability: a killed or stuck worker resumes with no step done twice; single flight per target; continue-as-new."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from runtime.connection import DATA_CONVERTER
from runtime.eviction_watch import EXIT_STUCK
from runtime.runs import TargetBusy
from runtime.server_config import dynamic_config_flags
from tests import support
from tests.conftest import SERVER_STARTUP, TEMPORAL_CLI
from workflows import search
from workflows.contract import ApproveRequest, ControlRequest


async def _finish_in_a_new_worker(address: str, task_queue: str, handle):
    """A fresh worker process takes the run over; the run's result once it ends (a minute at most)."""
    second = support.spawn_worker(address, task_queue)
    try:
        return await asyncio.wait_for(handle.result(), 60)
    finally:
        os.killpg(second.pid, signal.SIGKILL)
        second.wait()


async def test_worker_killed_mid_run_resumes_without_repeating_steps(env, task_queue, tmp_path):
    out = tmp_path / "executions.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: durable}}
        target: t
        steps:
          - id: a
            action: test.append
            with: {{path: "{out}", label: a}}
          - id: b
            action: test.append
            with: {{path: "{out}", label: b}}
          - id: settle
            wait: 3s
          - id: c
            action: test.append
            with: {{path: "{out}", label: c}}
          - id: d
            action: test.append
            with: {{path: "{out}", label: d}}
    """)
    address = env.client.service_client.config.target_host
    first = support.spawn_worker(address, task_queue)
    try:
        handle = await support.start(env.client, book, task_queue)
        await support.wait_for(lambda: _step_status(handle, "settle", "running"))
        os.killpg(first.pid, signal.SIGKILL)  # no graceful shutdown: the process just dies
        first.wait()
        assert [line.split()[-1] for line in support.lines(out)] == ["a", "b"]
        await _finish_in_a_new_worker(address, task_queue, handle)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    labels = [line.split()[-1] for line in support.lines(out)]
    assert labels == ["a", "b", "c", "d"], labels


async def test_worker_killed_mid_activity_the_attempt_is_retried_once_elsewhere(env, task_queue, tmp_path):
    """The hardest case: the worker dies while an action runs. The server notices the missing heartbeat and
    gives the attempt to another worker, which resumes from the last heartbeat; the action completes once."""
    out = tmp_path / "executions.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: durable-mid-activity}}
        target: t
        steps:
          - id: a
            action: test.append
            with: {{path: "{out}", label: a}}
          - id: slow
            action: test.slow_append
            with: {{path: "{out}", label: slow, seconds: 4}}
          - id: c
            action: test.append
            with: {{path: "{out}", label: c}}
    """)
    address = env.client.service_client.config.target_host
    first = support.spawn_worker(address, task_queue)
    try:
        handle = await support.start(env.client, book, task_queue)
        await support.wait_for(lambda: _has_line(out, "started slow 1"))
        await asyncio.sleep(1.0)  # a few heartbeats of progress recorded
        os.killpg(first.pid, signal.SIGKILL)  # mid-activity: the attempt never completes on this worker
        first.wait()
        assert [line.split()[-1] for line in support.lines(out)] == ["a", "1"]
        second = support.spawn_worker(address, task_queue)
        try:
            await handle.result()
            status = await support.status(handle)
        finally:
            os.killpg(second.pid, signal.SIGKILL)
            second.wait()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    lines = support.lines(out)
    assert [line for line in lines if line.startswith("started")] == ["started slow 1", "started slow 2"], lines
    assert [line.split()[-1] for line in lines if not line.startswith("started")] == ["a", "slow", "c"], lines
    assert next(s for s in status.steps if s.id == "slow").attempts == 1  # the step ran once; its activity twice


async def _has_line(path, line: str) -> bool:
    return path.exists() and line in support.lines(path)


async def _step_status(handle, step, wanted):
    status = await support.status(handle)
    # Before the worker has resolved the request the run holds no step yet.
    return any(s.id == step and s.status == wanted for s in status.steps)


async def test_a_run_its_worker_cannot_evict_ends_that_worker_and_resumes_in_the_next(env, task_queue, tmp_path):
    """temporalio cannot evict a run whose workflow task its deadlock detector interrupted (a task over 2 s, as
    on a starved machine) while another of the run's tasks waits on a timer (the status view): the run would
    hang in that worker, which could not shut down either. The worker notices, stops and exits with
    EXIT_STUCK; the next worker finishes the run, every step once."""
    out = tmp_path / "executions.txt"
    steps = "".join(f"""
          - id: {label}
            action: test.append
            with: {{path: "{out}", label: {label}}}""" for label in "abcd")
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: stuck}}
        target: t
        steps:{steps}
    """)
    address = env.client.service_client.config.target_host
    first = support.spawn_worker(address, task_queue, args=["--stall-once", "3", "--grace", "1"])
    try:
        handle = await support.start(env.client, book, task_queue)
        code = await asyncio.to_thread(first.wait, 60)
        assert first.stdout is not None
        said = first.stdout.read()
        assert code == EXIT_STUCK, said
        assert "Potential deadlock detected" in said and "a run cannot be evicted from this worker" in said, said
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        result = await _finish_in_a_new_worker(address, task_queue, handle)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert result.state == "succeeded"
    assert [line.split()[-1] for line in support.lines(out)] == ["a", "b", "c", "d"]


async def test_single_flight_per_target(env, task_queue, tmp_path):
    book = support.write_runbook(tmp_path, """
        metadata: {name: gatekeeper}
        target: t
        steps:
          - id: ok
            approval: {prompt: "go?"}
    """)
    other = support.write_runbook(tmp_path, """
        metadata: {name: other-book}
        target: t
        steps:
          - id: w
            wait: 1s
    """, name="other")
    target = {"name": f"busy-{task_queue}"}
    async with support.worker(env.client, task_queue):
        first = await support.start(env.client, book, task_queue, target=target)
        with pytest.raises(TargetBusy) as busy:
            await support.start(env.client, other, task_queue, target=target)
        message = str(busy.value)
        assert first.id in message and first.result_run_id in message and "gatekeeper" in message
        await support.wait_for(lambda: _awaiting(first, "ok"))
        await first.execute_update("approve", ApproveRequest(step="ok", approver="someone"))
        await first.result()
        # Once the target is free, a new run starts under the same workflow id.
        second = await support.start(env.client, other, task_queue, target=target)
        assert second.id == first.id and second.result_run_id != first.result_run_id
        await second.result()


async def _awaiting(handle, step):
    return step in (await support.status(handle)).awaiting_approval


async def test_pause_and_resume_between_steps(env, task_queue, tmp_path):
    out = tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: pausing}}
        target: t
        operators: [op]
        steps:
          - id: ok
            approval: {{prompt: "go?"}}
          - id: a
            action: test.append
            with: {{path: "{out}", label: a}}
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        await support.wait_for(lambda: _awaiting(handle, "ok"))
        await handle.execute_update("pause", ControlRequest(actor="op"))
        await handle.execute_update("approve", ApproveRequest(step="ok", approver="x"))
        await support.wait_for(lambda: _state(handle, "paused"))
        assert not out.exists()
        await handle.execute_update("resume", ControlRequest(actor="op"))
        await handle.result()
    assert len(support.lines(out)) == 1


async def _state(handle, wanted):
    return (await support.status(handle)).state == wanted


async def test_continue_as_new_keeps_outputs_and_state(task_queue, tmp_path):
    """With the server suggesting continue-as-new early, a long runbook spans several runs and still resolves references."""
    out = tmp_path / "out.txt"
    steps = "\n".join(
        f"""
          - id: s{i}
            action: test.append
            with: {{path: "{out}", label: "s{i} after ${{{{ steps.s0.outputs.line }}}}"}}"""
        for i in range(12)
    ).replace("s0 after ${{ steps.s0.outputs.line }}", "s0")
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: long}}
        target: t
        steps:{steps}
    """)
    environment = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI),
        data_converter=DATA_CONVERTER,
        search_attributes=search.ALL,
        dev_server_log_level="error",
        dev_server_extra_args=[*dynamic_config_flags(), "--dynamic-config-value", "limit.historyCount.suggestContinueAsNew=20"],
        dev_server_startup_timeout=SERVER_STARTUP,
    )
    try:
        async with support.worker(environment.client, task_queue):
            handle = await support.start(environment.client, book, task_queue)
            await handle.result(follow_runs=True)
            runs = [e async for e in environment.client.list_workflows(f"WorkflowId = '{handle.id}'")]
            assert len(runs) >= 3, "expected the run to continue as new at least twice"
            status = await support.status(environment.client.get_workflow_handle(handle.id))
            assert status.steps and all(s.status == "succeeded" for s in status.steps)
    finally:
        await environment.shutdown()
    labels = support.lines(out)
    assert len(labels) == 12
    assert labels[-1].endswith(f"s11 after {labels[0]}")


async def test_abort_cancels_a_long_running_action(env, task_queue, tmp_path):
    book = support.write_runbook(tmp_path, """
        metadata: {name: long-action}
        target: t
        operators: [op]
        steps:
          - id: slow
            action: core.wait
            with: {seconds: 120, heartbeat_every: 0.2}
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        await support.wait_for(lambda: _step_status(handle, "slow", "running"))
        await handle.execute_update("abort", ControlRequest(actor="op", reason="wrong target"))
        with pytest.raises(Exception) as failure:
            await asyncio.wait_for(handle.result(), timeout=20)
        assert "aborted by op: wrong target" in str(failure.value.cause)
