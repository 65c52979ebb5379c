"""Under a flood (a log sink that stops reading, a storm of status pollers, gate readings) the run goes on: sources shed and count."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import TypedSearchAttributes
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RPCError, RPCStatusCode

from activities.contracts.telemetry import READ_ACTIONS, READ_MANY_ACTION, READ_MANY_TIMEOUT
from cli import render
from cli.timeline import build_timeline
from runtime.connection import TASK_QUEUE_ENV, connect
from runtime.logs import configure_logging, flush_logging
from runtime.polling import RunWatch, read_full_status, read_status
from runtime.processes import free_port
from runtime.shedding import READINGS_SLOWED, ShedCounter
from tests import support
from workflows.calls import READING_PRIORITY
from workflows.contract import (
    ApproveRequest,
    ControlRequest,
    GateReading,
    RunStatus,
    StatusMemo,
    StepState,
    readings_queue,
    status_from_memo,
    status_memo,
)

ROOT = Path(__file__).resolve().parents[1]


def _samples(port: int, name: str) -> list[Any]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    return [s for family in text_string_to_metric_families(text) for s in family.samples if s.name == name]


async def test_a_blocked_log_sink_costs_counted_records_not_the_run(env, task_queue, tmp_path):
    """The real worker with its stderr a pipe nobody reads: the run completes, the drops are on
    /metrics, and the worker still stops on SIGTERM (a write stuck in the pipe does not hold its exit)."""
    port = free_port()
    note = "x" * 3000  # 60 notes of 3 kB overflow the 64 kB pipe and the 16-record queue
    steps = "\n".join(f"  - id: n{i}\n    action: core.note\n    with: {{message: {note}}}" for i in range(60))
    book = support.write_runbook(tmp_path, f"metadata: {{name: noisy}}\ntarget: t\nsteps:\n{steps}\n")
    worker = subprocess.Popen(
        [sys.executable, "worker.py", "--allow-development"], cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "TEMPORAL_ADDRESS": env.client.service_client.config.target_host, TASK_QUEUE_ENV: task_queue,
             "COLDSTART_METRICS": f"127.0.0.1:{port}", "COLDSTART_LOG_QUEUE": "16",
             "COLDSTART_JOURNAL": str(tmp_path / "journal.jsonl"), "COLDSTART_TARGETS": str(tmp_path / "targets")},
    )
    try:
        handle = await support.start(env.client, book, task_queue,
                                     target=support.development_target(tmp_path / "targets", "noisy-" + task_queue))
        result = await asyncio.wait_for(handle.result(), timeout=180)
        assert result.state == "succeeded"
        dropped = _samples(port, "coldstart_log_records_dropped_total")
        assert sum(s.value for s in dropped if s.labels.get("reason") == "queue_full") > 0, dropped
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


class _CountingHandle:
    """A workflow handle that records each describe (with the history length it saw) and each Query."""

    def __init__(self, handle: Any, calls: list[tuple[str, int]]) -> None:
        self._handle = handle
        self._calls = calls

    async def describe(self):
        description = await self._handle.describe()
        self._calls.append(("describe", description.raw_description.workflow_execution_info.history_length))
        return description

    async def query(self, *args: Any, **kwargs: Any):
        self._calls.append(("query", self._calls[-1][1] if self._calls else -1))
        return await self._handle.query(*args, **kwargs)

    async def result(self, *args: Any, **kwargs: Any):
        self._calls.append(("result", self._calls[-1][1] if self._calls else -1))
        return await self._handle.result(*args, **kwargs)


class _CountingClient:
    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: list[tuple[str, int]] = []

    def get_workflow_handle(self, workflow_id: str) -> _CountingHandle:
        return _CountingHandle(self._client.get_workflow_handle(workflow_id), self.calls)


async def test_a_storm_of_followers_reads_the_server_never_the_worker(env, task_queue, tmp_path):
    book = support.write_runbook(tmp_path, """
        metadata: {name: watched}
        target: t
        steps:
          - {id: before, action: core.wait, with: {seconds: 0}}
          - {id: quiet, wait: 3s}
          - {id: after, action: core.wait, with: {seconds: 0}}
    """)
    followers = [_CountingClient(env.client) for _ in range(50)]
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        codes = await asyncio.gather(*(render.follow(f, handle.id, Console(file=io.StringIO()), interval=0.2)
                                       for f in followers))
    assert codes == [0] * 50
    final = (await handle.describe()).raw_description.workflow_execution_info.history_length
    for follower in followers:
        # Describes only: the running run's status and its last (the run put it there as it ended) came
        # from its memo. Not one Query, nor a read of the close event.
        assert {kind for kind, _ in follower.calls} == {"describe"}, follower.calls
        # It watched through the quiet 3 s, less often as the run stood still (up to 0.6 s apart, not 0.2).
        assert follower.calls[-1] == ("describe", final) and len(follower.calls) >= 5, follower.calls


async def test_a_closed_runs_view_comes_from_its_close_event_and_matches_its_status_query(env, task_queue, tmp_path):
    """While the run waits, the view's status (from the memo) is the Query's, less outputs and older
    readings; each way a run ends, its last status is what a Query on the closed run says, less the
    same, and `coldstart status --json` has all of it, from the close event. The view never Queries."""
    prom = await support.ScriptedPrometheus().start()
    flag = tmp_path / "never"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: ends}}
        target: t
        approvers: [alice]
        steps:
          - {{id: noted, action: core.note, with: {{message: "restoring"}}}}
          - id: healthy
            gate: {{endpoint: "{prom.url}", query: up, comparator: ">=", threshold: 1, interval: 0.05s, consecutive: 3, timeout: 20s}}
          - {{id: ok, approval: {{prompt: "go?"}}}}
          - id: flaky
            action: test.maybe_fail
            with: {{path: "{tmp_path / 'out'}", label: flaky, fail_until_file_exists: "{flag}"}}
    """)
    ends = {}
    async with support.worker(env.client, task_queue):
        for end in ("succeeded", "failed", "aborted", "terminated"):
            client = _CountingClient(env.client)
            handle = await support.start(env.client, book, task_queue, target={"name": f"{end}-{task_queue}"})
            watch = RunWatch(client.get_workflow_handle(handle.id), interval=0.1, query_every=0.1)
            await support.wait_for(lambda: _awaiting_ok(handle))
            waiting, queried = await watch.next(), await read_status(handle)
            assert queried.steps[0].outputs and len(queried.steps[1].readings) == 3
            assert waiting == _kept(queried) and waiting.awaiting_approval == ["ok"]
            if end == "succeeded":  # a running run's outputs only its Query has: one describe, then the Query
                probe = _CountingClient(env.client)
                running = await read_full_status(probe.get_workflow_handle(handle.id))
                assert running.steps[0].outputs and [kind for kind, _ in probe.calls] == ["describe", "query"], probe.calls
            if end == "aborted":
                await handle.execute_update("abort", ControlRequest(actor="alice", reason="drill over"))
            elif end == "terminated":
                await handle.terminate("operator gone")
            else:
                flag.touch() if end == "succeeded" else flag.unlink(missing_ok=True)
                await handle.execute_update("approve", ApproveRequest(step="ok", approver="alice"))
            while not (final := await watch.next()).over:
                pass
            # The view's last status from the memo, for every end: terminated, it still says running and the
            # description says how it ended. No Query, no read of the close event.
            assert {kind for kind, _ in client.calls} == {"describe"}, client.calls
            ends[end] = final
            # `coldstart status --json` wants every step's outputs: a closed run's close event has them.
            probe = _CountingClient(env.client)
            full = await read_full_status(probe.get_workflow_handle(handle.id))
            calls = [kind for kind, _ in probe.calls]
            if end != "terminated":
                assert full == await read_status(handle) and final == _kept(full), end
                assert full.steps[0].outputs and calls == ["describe", "result"], probe.calls
            else:  # terminated from outside: no close event says how the steps ended, so the worker is asked
                assert full == await read_status(handle) and calls == ["describe", "query"], probe.calls
    await prom.stop()
    assert {end: status.state for end, status in ends.items()} == {
        "succeeded": "succeeded", "failed": "failed", "aborted": "aborted", "terminated": "failed"}
    assert ends["succeeded"].steps[2].approvals[0].approver == "alice" and ends["succeeded"].ended_at is not None
    assert "injected failure" in (ends["failed"].error or "") and ends["failed"].steps[-1].status == "failed"
    assert [c.verb for c in ends["aborted"].controls] == ["abort"] and "drill over" in (ends["aborted"].error or "")
    assert ends["terminated"].error == "the run was terminated" and ends["terminated"].current_step is None


def _kept(status: RunStatus) -> RunStatus:
    """What the run's memo keeps of `status`: no step outputs, the last reading only."""
    return status.model_copy(update={"steps": [step.model_copy(update={"outputs": {}, "readings": step.readings[-1:]})
                                               for step in status.steps]})


async def _awaiting_ok(handle: Any) -> bool:
    return "ok" in (await support.status(handle)).awaiting_approval


def test_the_status_memo_upserts_what_changed_cuts_long_texts_and_stops_within_its_budget():
    steps = [StepState(id=f"s{i}", kind="action", outputs={"big": "x" * 5000},
                       readings=[GateReading(gate="g", at=datetime.now(UTC), value=float(k)) for k in range(3)])
             for i in range(3)]
    status = RunStatus(workflow_id="w", runbook="r", target="t", initiator="i", drill=False, state="running",
                       started_at=datetime.now(UTC), steps=steps)
    memo = StatusMemo()
    first = memo.changes(status)
    assert sorted(first) == ["coldstart.run", "coldstart.step.s0", "coldstart.step.s1", "coldstart.step.s2"]
    assert memo.changes(status) == {}
    status.steps[1].status, status.steps[1].error = "failed", "e" * 5000
    again = memo.changes(status)
    assert list(again) == ["coldstart.step.s1"] and len(again["coldstart.step.s1"]["error"]) == 500
    # What a view reads back: the status less outputs and older readings, long texts cut.
    kept = status_from_memo({**first, **again})
    assert kept is not None and [step.outputs for step in kept.steps] == [{}] * 3
    assert [len(step.readings) for step in kept.steps] == [1] * 3 and kept.steps[0].readings[0].value == 2.0
    assert kept.steps[1].error == "e" * 499 + "…" and kept.steps[1].status == "failed"

    small = StatusMemo(budget=1000)
    assert small.changes(status) == {"coldstart.run": {"kept": False}} and small.full
    assert small.changes(status) == {}
    assert status_from_memo({**first, "coldstart.run": {"kept": False}}) is None  # views Query instead


def test_compact_memo_entries_leave_out_defaults_and_read_back_as_the_full_ones():
    now = datetime.now(UTC)
    steps = [StepState(id="pending", kind="action", title="not yet"),
             StepState(id="done", kind="action", status="succeeded", started_at=now, ended_at=now, attempts=1,
                       outputs={"x": 1}),
             StepState(id="gate", kind="gate", status="failed", started_at=now, attempts=2, error="e" * 900,
                       readings=[GateReading(gate="g", at=now, value=0.5, error="slow"),
                                 GateReading(gate="g", at=now, value=1.0, passed=True)]),
             StepState(id="cleared", kind="action", status="running", started_at=now, error=None)]
    status = RunStatus(workflow_id="w", runbook="r", target="t", initiator="i", drill=False, state="running",
                       started_at=now, steps=steps, error="run " * 200)
    compact, full = status_memo(status), status_memo(status, compact=False)
    assert compact["coldstart.step.pending"] == {"position": 0, "id": "pending", "kind": "action", "title": "not yet"}
    assert "error" not in compact["coldstart.step.done"] and "readings" not in compact["coldstart.step.done"]
    assert compact["coldstart.step.gate"]["readings"] == [{"gate": "g", "at": now.isoformat().replace("+00:00", "Z"),
                                                           "value": 1.0, "passed": True}]
    assert len(compact["coldstart.step.gate"]["error"]) == len(compact["coldstart.run"]["error"]) == 500
    size = {form: len(json.dumps(memo)) for form, memo in (("compact", compact), ("full", full))}
    assert size["compact"] < 0.7 * size["full"], size
    # A view reads either form as the same status: what the run keeps of it.
    assert status_from_memo(compact) == status_from_memo(full) is not None
    assert status_from_memo(compact).steps[2].error == "e" * 499 + "…"  # type: ignore[union-attr]
    # An error cleared (a retry) leaves the entry: the key's new value replaces the old one whole.
    memo = StatusMemo()
    memo.changes(status)
    status.steps[2].error = None
    assert "error" not in memo.changes(status)["coldstart.step.gate"]


class _RefusingHandle:
    def __init__(self, refusals: int, code: RPCStatusCode = RPCStatusCode.RESOURCE_EXHAUSTED, message: str = "refused") -> None:
        self.refusals = refusals
        self.code = code
        self.message = message
        self.calls = 0

    async def query(self, *args: Any, **kwargs: Any) -> str:
        self.calls += 1
        if self.calls <= self.refusals:
            raise RPCError(self.message, self.code, b"")
        return "status"


async def test_refused_status_reads_back_off_with_jitter_and_give_up():
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    answering = _RefusingHandle(refusals=4)
    assert await read_status(answering, sleep=sleep) == "status"  # type: ignore[arg-type]
    assert answering.calls == 5 and len(waits) == 4
    assert all(0 <= wait <= min(10.0, 0.5 * 2 ** k) for k, wait in enumerate(waits, 1)), waits
    assert len(set(waits)) > 1  # jittered, so a storm of CLIs does not come back in step

    waits.clear()
    away = _RefusingHandle(refusals=10**6, code=RPCStatusCode.UNAVAILABLE)
    with pytest.raises(RPCError):
        await read_status(away, sleep=sleep)  # type: ignore[arg-type]
    assert away.calls == 6 and len(waits) == 5

    timed_out = _RefusingHandle(refusals=2, code=RPCStatusCode.CANCELLED, message="Timeout expired")
    assert await read_status(timed_out, sleep=sleep) == "status"  # type: ignore[arg-type]
    assert timed_out.calls == 3

    missing = _RefusingHandle(refusals=1, code=RPCStatusCode.NOT_FOUND)
    with pytest.raises(RPCError):
        await read_status(missing, sleep=sleep)  # type: ignore[arg-type]
    assert missing.calls == 1  # not an overload: no point asking again


async def test_a_gate_reading_flood_is_counted_reading_by_reading_while_another_run_completes(env, task_queue, tmp_path):
    prom = await support.ScriptedPrometheus().start()
    port = free_port()
    runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"127.0.0.1:{port}")))
    client = await connect(runtime=runtime, target_host=env.client.service_client.config.target_host)
    flood = support.write_runbook(tmp_path, """
        metadata: {name: flood}
        target: t
        steps:
          - id: readings
            parallel:
    """ + "".join(f"""
              - id: g{i}
                gate: {{name: up{i}, endpoint: "{prom.url}", query: up, comparator: ">=", threshold: 1,
                        interval: 0.01s, consecutive: 8}}
    """ for i in range(8)), name="flood")
    quiet = support.write_runbook(tmp_path, """
        metadata: {name: quiet}
        target: t
        steps:
          - {id: a, action: core.wait, with: {seconds: 0}}
          - {id: b, action: core.wait, with: {seconds: 0}}
    """, name="quiet")
    try:
        async with support.worker(client, task_queue):
            flooding = await support.start(client, flood, task_queue)
            other = await support.start(client, quiet, task_queue, target={"name": f"other-{task_queue}"})
            assert (await other.result()).state == "succeeded"
            assert (await flooding.result()).state == "succeeded"
            status = await support.status(flooding)
        evaluations = _samples(port, "coldstart_gate_evaluations_total")
    finally:
        await prom.stop()
    kept = {s.id: [r.gate for r in s.readings] for s in status.steps if s.kind == "gate"}
    assert kept == {f"g{i}": [f"up{i}"] * 8 for i in range(8)}, kept
    counted = {s.labels["gate"]: s.value for s in evaluations if s.labels.get("runbook") == "flood"}
    # Metrics are aggregated in the worker (one series per runbook and gate): a flood grows counts, never a buffer.
    assert counted == {f"up{i}": 8 for i in range(8)}, counted


def _readings(history: Any) -> list[tuple[Any, Any]]:
    """(scheduled attributes, started event) of each gate reading in a run's history."""
    scheduled = {e.event_id: e.activity_task_scheduled_event_attributes for e in history.events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                 and e.activity_task_scheduled_event_attributes.activity_type.name in READ_ACTIONS}
    times = {e.event_id: e.event_time.ToDatetime() for e in history.events}
    return [(scheduled[e.activity_task_started_event_attributes.scheduled_event_id],
             (e.event_time.ToDatetime() - times[e.activity_task_started_event_attributes.scheduled_event_id]).total_seconds())
            for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
            and e.activity_task_started_event_attributes.scheduled_event_id in scheduled]


def _gates_book(tmp_path: Path, name: str, url: str, gates: int, consecutive: int, interval: str = "0.01s") -> Path:
    return support.write_runbook(tmp_path, f"""
        metadata: {{name: {name}}}
        target: t
        steps:
          - id: readings
            parallel:
    """ + "".join(f"""
              - id: g{i}
                gate: {{name: up{i}, endpoint: "{url}", query: up, comparator: ">=", threshold: 1,
                        interval: {interval}, consecutive: {consecutive}, timeout: 1h}}
    """ for i in range(gates)), name=name)


async def test_a_runs_gates_due_together_read_in_one_paced_activity_on_a_queue_of_their_own(env, task_queue, tmp_path):
    """Six parallel gates due at once cost the server one telemetry.read_many a tick, not six; their
    10 ms wait is waited in the readings (each read's not_before), not on a timer; the activity goes to
    the readings queue keyed to its run, and the worker takes its readings at its pace (2 a second
    here), one by one."""
    prom = await support.ScriptedPrometheus().start()
    book = _gates_book(tmp_path, "paced", prom.url, gates=6, consecutive=2)
    try:
        async with support.worker(env.client, task_queue, readings_per_second=2):
            handle = await support.start(env.client, book, task_queue)
            assert (await asyncio.wait_for(handle.result(), timeout=120)).state == "succeeded"
            status = await support.status(handle)
    finally:
        await prom.stop()
    history = await handle.fetch_history()
    readings = _readings(history)
    assert len(readings) == 2  # two ticks of six gates each
    waits = []
    for attributes, _ in readings:
        assert attributes.activity_type.name == READ_MANY_ACTION
        assert attributes.task_queue.name == readings_queue(task_queue)
        assert attributes.priority.priority_key == READING_PRIORITY
        assert attributes.priority.fairness_key == handle.id
        # Long enough for three full batches at a twentieth of the pace; a lost worker found in 10 s.
        assert attributes.start_to_close_timeout.ToTimedelta() == READ_MANY_TIMEOUT == timedelta(seconds=180)
        assert attributes.heartbeat_timeout.ToTimedelta() == timedelta(seconds=10)
        reads = json.loads(attributes.input.payloads[0].data)["reads"]
        assert [(r["step"], r["gate"]) for r in reads] == [(f"g{i}", f"up{i}") for i in range(6)]
        waits.append({r.get("not_before") is not None for r in reads})
    assert waits == [{False}, {True}]  # the first reading is due at once, the second 10 ms after
    assert not support.step_timers(history)
    assert {s.id: [r.gate for r in s.readings] for s in status.steps if s.kind == "gate"} == {
        f"g{i}": [f"up{i}"] * 2 for i in range(6)}
    assert len(prom.calls) == 12
    # The timeline tells each gate's readings apart, though two activities carried all twelve.
    timeline = await build_timeline(env.client, handle.id)
    entries = [(e.step, e.detail) for e in timeline.entries if e.event == "gate reading"]
    assert sorted(entries) == sorted((f"g{i}", f"up{i}: up = 1.0") for i in range(6) for _ in range(2)), entries
    # Every step that ran is in the timeline: the parallel step too, which reads nothing itself.
    assert {step: summary.readings for step, summary in timeline.steps.items()} == {
        "readings": 0, **{f"g{i}": 2 for i in range(6)}}
    assert all(row.nested for row in timeline.rows() if row.summary.step != "readings")
    # 12 readings at 2 a second, evenly spaced: the worker cannot have taken them in under 5 s
    # (a lower bound only, which load cannot break).
    times = {e.event_id: e.event_time.ToDatetime() for e in history.events}
    done = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED]
    first_started = min(times[e.activity_task_completed_event_attributes.started_event_id] for e in done)
    assert (max(times[e.event_id] for e in done) - first_started).total_seconds() >= 5.0


async def _gated_run(env: Any, task_queue: str, tmp_path: Path, name: str, **book: Any) -> tuple[Any, list[str]]:
    """A run of _gates_book(**book) to its success: its history, and the queries its gates read."""
    prom = await support.ScriptedPrometheus().start()
    try:
        async with support.worker(env.client, task_queue):
            handle = await support.start(env.client, _gates_book(tmp_path, name, prom.url, **book), task_queue)
            assert (await asyncio.wait_for(handle.result(), timeout=120)).state == "succeeded"
    finally:
        await prom.stop()
    return await handle.fetch_history(), prom.calls


async def test_gates_due_again_after_more_than_a_second_share_one_timer(env, task_queue, tmp_path):
    """A wait of more than a second is a server timer (an activity slot is held a second at most), one a
    tick for the gates due together."""
    history, calls = await _gated_run(env, task_queue, tmp_path, "ticked", gates=3, consecutive=2, interval="2s")
    readings = _readings(history)
    assert len(readings) == 2 and len(calls) == 6
    assert not any("not_before" in read for attributes, _ in readings
                   for read in json.loads(attributes.input.payloads[0].data)["reads"])
    timers = [e.timer_started_event_attributes for e in support.step_timers(history)]
    assert [t.start_to_fire_timeout.ToTimedelta().total_seconds() for t in timers] == [2.0]


def _readings_done(history) -> list:
    """When each gate reading's activity completed (the run's other activities, its resolution first, left out)."""
    reads = {e.event_id for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
             and e.activity_task_scheduled_event_attributes.activity_type.name in READ_ACTIONS}
    return sorted(e.event_time.ToDatetime() for e in history.events
                  if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
                  and e.activity_task_completed_event_attributes.scheduled_event_id in reads)


@pytest.mark.parametrize("interval", ["0.6s", "1s"])
async def test_a_gate_interval_of_a_second_or_less_is_waited_in_the_reading_and_kept(env, task_queue, tmp_path, interval):
    """An interval of a second or less is waited by the reading's activity (Temporal fires a sub-second timer
    about a second late, and a timer and the workflow task it wakes are five history events a reading), and no
    reading comes sooner than the interval after the one before."""
    history, _calls = await _gated_run(env, task_queue, tmp_path, "waited", gates=1, consecutive=3, interval=interval)
    assert not support.step_timers(history)
    done = _readings_done(history)
    # A lower bound only, which load cannot break (the server's and the worker's clocks are this machine's).
    least = float(interval.removesuffix("s")) - 0.01
    assert len(done) == 3 and all((b - a).total_seconds() >= least for a, b in itertools.pairwise(done)), done


async def test_one_runs_flood_of_readings_does_not_starve_another_runs_gate(env, task_queue, tmp_path):
    """Fairness per run: with readings backed up behind a 24-gate flood, the other run's readings
    are taken in turn with the flood's, not after the whole backlog."""
    prom = await support.ScriptedPrometheus().start()
    flood = _gates_book(tmp_path, "flood", prom.url, gates=24, consecutive=1000)
    quiet = _gates_book(tmp_path, "quiet", prom.url, gates=1, consecutive=4)
    try:
        async with support.worker(env.client, task_queue, readings_per_second=4):
            flooding = await support.start(env.client, flood, task_queue)
            await asyncio.sleep(3)  # the backlog forms: 24 readings wanted at once, 4 taken a second
            other = await support.start(env.client, quiet, task_queue, target={"name": f"other-{task_queue}"})
            assert (await asyncio.wait_for(other.result(), timeout=120)).state == "succeeded"
            # The other run's 10 ms waits are waited in its readings, so it may end before the flood's
            # first batch (its first 20 gates; the other 4 are a batch of their own, read again and
            # again meanwhile): that batch's span is the one to compare with.
            first_batch = await support.wait_for(lambda: _first_reading_span(flooding), timeout=60)
            await flooding.terminate("test over")
    finally:
        await prom.stop()
    other_spans = _reading_spans(await other.fetch_history())
    assert len(other_spans) == 4
    # The flood's first batch needs 20 of the worker's slots, 4 a second: 5 s at least. Handed out
    # first come first served, the other run's reading would wait behind all of the flood's backlog;
    # in turn with the flood's it waits about one slot.
    assert first_batch > 4.5, first_batch
    assert other_spans[-1] < first_batch * 0.4, (other_spans, first_batch)


async def test_a_workers_readings_yield_to_the_steps_it_runs_and_are_counted(env, task_queue, tmp_path):
    """While the worker runs another run's steps, a gate's readings take its share of the pace (a twentieth
    of 4 a second here: one each 5 s), each counted in coldstart_gate_readings_slowed_total."""
    prom = await support.ScriptedPrometheus().start()
    steps = support.write_runbook(tmp_path, "metadata: {name: steps}\ntarget: t\nsteps:\n" + "".join(
        f"  - {{id: s{i}, action: core.wait, with: {{seconds: 0.1}}}}\n" for i in range(120)), name="steps")
    gate = _gates_book(tmp_path, "gate", prom.url, gates=1, consecutive=3)
    slowed = READINGS_SLOWED.value("steps_running")
    try:
        async with support.worker(env.client, task_queue, readings_per_second=4, readings_share=0.05):
            busy = await support.start(env.client, steps, task_queue)
            await support.wait_for(lambda: _step_started(busy))
            gated = await support.start(env.client, gate, task_queue, target={"name": f"gated-{task_queue}"})
            assert (await asyncio.wait_for(gated.result(), timeout=120)).state == "succeeded"
            running = (await busy.describe()).status == WorkflowExecutionStatus.RUNNING
            await asyncio.wait_for(busy.result(), timeout=120)
    finally:
        await prom.stop()
    assert running, "the steps ended before the gate's three readings: the test proves nothing"
    assert READINGS_SLOWED.value("steps_running") - slowed >= 2
    history = await gated.fetch_history()
    done = _readings_done(history)
    # Slots 5 s apart at a twentieth of 4 a second (at the full pace the timer's ~1 s would set the
    # gap): a lower bound only, which load cannot break.
    assert len(done) == 3 and all((b - a).total_seconds() >= 4.9 for a, b in itertools.pairwise(done)), done


async def _step_started(handle: Any) -> bool:
    return (await support.status(handle)).current_step not in (None, "starting")


async def _first_reading_span(handle: Any) -> float | None:
    """Seconds from scheduled to completed of a run's first reading activity; None while it runs."""
    history = await handle.fetch_history()
    times = {e.event_id: e.event_time.ToDatetime() for e in history.events}
    first = next((e.event_id for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                  and e.activity_task_scheduled_event_attributes.activity_type.name in READ_ACTIONS), None)
    return next(((times[e.event_id] - times[first]).total_seconds() for e in history.events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
                 and e.activity_task_completed_event_attributes.scheduled_event_id == first), None)


def _reading_spans(history: Any) -> list[float]:
    """Seconds from scheduled to completed of each reading activity in a run's history, sorted."""
    scheduled = {attributes.activity_id for attributes, _ in _readings(history)}
    times = {e.event_id: e.event_time.ToDatetime() for e in history.events}
    ids = {e.event_id: e.activity_task_scheduled_event_attributes.activity_id for e in history.events
           if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED}
    return sorted((times[e.event_id] - times[e.activity_task_completed_event_attributes.scheduled_event_id]).total_seconds()
                  for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
                  and ids[e.activity_task_completed_event_attributes.scheduled_event_id] in scheduled)


class _Described:
    """describe() results for RunWatch: a running run whose history grows by one event per call."""

    def __init__(self) -> None:
        self.length = 0
        self.queries = 0

    async def describe(self) -> Any:
        from temporalio.client import WorkflowExecutionStatus

        self.length += 1
        info = type("Info", (), {"history_length": self.length})()
        raw = type("Raw", (), {"workflow_execution_info": info})()
        async def no_memo(_: Any) -> dict[str, Any]:
            return {}  # a run started before its status was kept in the memo

        return type("Description", (), {"raw_description": raw, "status": WorkflowExecutionStatus.RUNNING, "memo": no_memo,
                                        "typed_search_attributes": TypedSearchAttributes([])})()

    async def query(self, *args: Any, **kwargs: Any) -> RunStatus:
        self.queries += 1
        return RunStatus(workflow_id="w", runbook="r", target="t", initiator="i", drill=False, state="running",
                         started_at=datetime.now(UTC), steps=[])


async def test_a_watch_spreads_a_reconnect_storm_and_its_queries():
    """Views started together neither first ask nor later Query (a run without a status memo) in the same instant."""
    firsts: list[float] = []
    gaps: list[float] = []
    for _ in range(20):
        now = [0.0]
        sleeps: list[float] = []

        async def sleep(seconds: float) -> None:
            sleeps.append(seconds)
            now[0] += seconds

        handle = _Described()
        watch = RunWatch(handle, interval=1.0, query_every=2.0, sleep=sleep, clock=lambda: now[0])  # type: ignore[arg-type]
        await watch.next()
        firsts.append(sleeps[0])
        queried_at = now[0]
        await watch.next()
        gaps.append(now[0] - queried_at)
        assert handle.queries == 2
    assert all(0 <= first < 1.0 for first in firsts) and len(set(firsts)) > 1, firsts
    # Every view waits 1 to 3 s (query_every 2 s, jittered) before its next Query, each its own.
    assert all(1.0 <= gap <= 3.0 + 1.5 for gap in gaps) and len(set(gaps)) > 1, gaps


class _Waiting:
    """describe() results for RunWatch: a running run that keeps its status in its memo and stands still
    (an approval) for `still` describes after each move."""

    def __init__(self, still: int) -> None:
        self.still = still
        self.length = 10
        self.describes = 0
        self._left = 0  # the first describe sees it move
        self.status = RunStatus(workflow_id="w", runbook="r", target="t", initiator="i", drill=False, state="running",
                                started_at=datetime.now(UTC), steps=[])

    async def describe(self) -> Any:
        from temporalio.client import WorkflowExecutionStatus

        self.describes += 1
        if self._left:
            self._left -= 1
        else:  # it moves: an approver approved, a step ended
            self.length += 3
            self._left = self.still
        info = type("Info", (), {"history_length": self.length})()
        raw = type("Raw", (), {"workflow_execution_info": info})()
        memo = status_memo(self.status)

        async def kept(_: Any) -> dict[str, Any]:
            return memo

        return type("Description", (), {"raw_description": raw, "status": WorkflowExecutionStatus.RUNNING, "memo": kept,
                                        "typed_search_attributes": TypedSearchAttributes([])})()


async def test_a_view_of_a_run_that_stands_still_reads_it_less_often_up_to_6_s():
    """Fifty views of a run waiting on its approver describe it a third as often, and each view's waits
    grow by half while it stands still, start again at one interval when it moves, and never pass
    6 s (jitter aside)."""
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    handle = _Waiting(still=12)
    watch = RunWatch(handle, interval=2.0, sleep=sleep, spread_first=False)  # type: ignore[arg-type]
    await watch.next()  # the first read: the run as it is
    for _ in range(3):
        sleeps.clear()
        await watch.next()  # 12 describes find it where it was, the 13th sees it move
        assert handle.describes % 13 == 1
        between, *idle = sleeps
        assert len(idle) == 12
        assert 1.0 <= between <= 3.0  # one interval, jittered, after a move
        # Each wait is at most 1.5 times the base (jitter), the base 3, 4.5, then 6 s (the cap) and no more.
        for unmoved, wait in enumerate(idle, start=1):
            base = min(2.0 * 1.5 ** unmoved, 6.0)
            assert 0.5 * base <= wait <= 1.5 * base, (unmoved, wait)
    # Over a long wait, about one describe per 6 s instead of per 2 s: a third of the calls.
    standing = await _describes_over(still=10_000, seconds=1800.0)
    assert 1800 / 6 * 0.8 <= standing <= 1800 / 6 * 1.25, standing


async def _describes_over(*, still: int, seconds: float) -> int:
    """How many describes one view of a run standing still makes in `seconds` (its clock the sleeps')."""
    now = [0.0]

    class _Over(Exception):
        pass

    async def sleep(wait: float) -> None:
        now[0] += wait
        if now[0] > seconds:
            raise _Over

    handle = _Waiting(still=still)
    watch = RunWatch(handle, interval=2.0, sleep=sleep, spread_first=False)  # type: ignore[arg-type]
    await watch.next()
    try:
        await watch.next()
    except _Over:
        pass
    return handle.describes


class _StuckSink:
    """A stream whose first write blocks until released, as a pipe nobody reads does."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.entered.set()
        self.release.wait(10)
        self.lines.append(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_a_stopped_sink_sheds_records_before_any_work_on_them():
    sink = _StuckSink()
    dropped = ShedCounter("test_dropped", "test")
    configure_logging("INFO", stream=sink, queue_size=4, dropped=dropped)  # type: ignore[arg-type]
    try:
        log = structlog.get_logger("test.flood")
        log.info("flood", i=0)
        assert sink.entered.wait(10)  # the writer is stuck in its first write
        for i in range(1, 50):
            log.info("flood", i=i)
            log.debug("below the level: never queued, never counted", i=i)
        logging.getLogger("test.stdlib").warning("a stdlib record behind the full queue")
        # The queue takes four; the other 45 structlog records and the stdlib one are shed.
        assert dropped.value("queue_full") == 46
    finally:
        sink.release.set()
        flush_logging()
        configure_logging("INFO")
    assert len(sink.lines) == 5 and all("flood" in line for line in sink.lines), sink.lines


class _Meter:
    """A metric meter recording each add its counter gets."""

    def __init__(self) -> None:
        self.adds: list[tuple[int, dict[str, str]]] = []

    def create_counter(self, name: str, description: str) -> Any:
        adds = self.adds

        class _Counter:
            def add(self, value: int, attributes: dict[str, str]) -> None:
                adds.append((value, dict(attributes)))

        return _Counter()


def test_drop_counts_reach_the_metric_in_batches_earlier_ones_included():
    counter = ShedCounter("test_batched", "test")
    counter.add("queue_full", 3)
    meter = _Meter()
    counter.bind(meter)  # type: ignore[arg-type]
    assert meter.adds == [(3, {"reason": "queue_full"})]
    for _ in range(1000):
        counter.add("queue_full")
    counter.add("sampled", 2)
    counter.export()
    totals: dict[str, int] = {}
    for value, attributes in meter.adds:
        totals[attributes["reason"]] = totals.get(attributes["reason"], 0) + value
    assert totals == {"queue_full": 1003, "sampled": 2}
    # A few adds (this export's, and the exporter thread's if it ran meanwhile), not one per drop.
    assert len(meter.adds) <= 5, meter.adds
    counter.export()  # nothing new: nothing added
    assert sum(value for value, _ in meter.adds) == 1005


class _Lines(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_a_flood_of_one_record_is_sampled_and_counted_and_other_records_pass():
    """Of one kind of record in a second the first 3 are kept, then every 2nd; the others are counted;
    another kind, a stdlib record and the next second start their own counts."""
    sink, dropped, now = _Lines(), ShedCounter("test_sampled", "test"), [100.0]
    configure_logging("INFO", stream=sink, dropped=dropped, sample_first=3, sample_thereafter=2, clock=lambda: now[0])
    try:
        log = structlog.get_logger("test.flood")
        for i in range(10):
            log.info("flood", i=i)
        log.info("another kind")
        for i in range(5):
            logging.getLogger("test.stdlib").warning("core says %s", i)  # one kind: the same template
        now[0] = 101.2
        log.info("flood", i=10)
    finally:
        flush_logging()
        configure_logging("INFO")
    records = [json.loads(line) for line in sink.getvalue().splitlines()]
    floods = [r["i"] for r in records if r["event"] == "flood"]
    assert floods == [0, 1, 2, 4, 6, 8, 10], records
    assert [r["event"] for r in records if r["event"] != "flood"] == [
        "another kind", "core says 0", "core says 1", "core says 2", "core says 4"], records
    assert dropped.value("sampled") == 4 + 1 and dropped.value() == 5


def test_sampling_is_off_at_zero():
    sink = _Lines()
    configure_logging("INFO", stream=sink, sample_first=0)
    try:
        for i in range(300):
            structlog.get_logger("test.flood").info("flood", i=i)
    finally:
        flush_logging()
        configure_logging("INFO")
    assert len(sink.getvalue().splitlines()) == 300
