"""The core actions and a lost worker: a wait or a query heartbeats often enough for its heartbeat timeout, and every action the soak and the drain run is given to another worker within bench/soak.py's 15 s recovery goal."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from temporalio.testing import ActivityEnvironment

from activities.catalog import load_registry
from activities.contracts.core import NOTE, PROMETHEUS_QUERY, WAIT, PrometheusQueryInput, WaitInput
from activities.core import prometheus_query, wait
from activities.heartbeats import heartbeating

RECOVERY_GOAL = timedelta(seconds=15)


def _env(heartbeat_timeout: timedelta | None, details: list[float] | None = None) -> tuple[ActivityEnvironment, list[float]]:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=heartbeat_timeout, heartbeat_details=details or [])
    beats: list[float] = []
    env.on_heartbeat = lambda *details: beats.append(asyncio.get_running_loop().time())
    return env, beats


@pytest.fixture
async def slow_prometheus() -> AsyncIterator[tuple[str, list[float]]]:
    """A Prometheus stand-in answering `up` = 1 after the delay put in its list (seconds)."""
    delay = [0.0]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(delay[0])
        body = json.dumps({"status": "success", "data": {"resultType": "vector",
                                                         "result": [{"metric": {}, "value": [0, "1"]}]}}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}", delay


async def test_a_wait_beats_within_a_third_of_its_heartbeat_timeout_even_when_asked_to_beat_less():
    env, beats = _env(timedelta(seconds=0.3))
    started = asyncio.get_running_loop().time()
    out = await env.run(wait, WaitInput(seconds=0.5, heartbeat_every=60))
    assert out.waited_seconds == 0.5
    gaps = [b - a for a, b in zip([started, *beats], beats, strict=False)]
    assert len(beats) >= 5 and max(gaps) < 0.3, gaps  # 0.1 s apart (a third of 0.3 s), not 60 s


async def test_without_a_heartbeat_timeout_the_wait_beats_as_asked_and_resumes_from_its_last_beat():
    env, beats = _env(None, details=[0.2])
    out = await env.run(wait, WaitInput(seconds=0.4, heartbeat_every=0.1))
    assert out.waited_seconds == 0.4  # 0.2 s were done before this attempt
    assert len(beats) == 2


async def test_a_slow_query_heartbeats_while_it_waits_and_a_quick_one_does_not(slow_prometheus):
    url, delay = slow_prometheus
    env, beats = _env(timedelta(seconds=0.3))
    delay[0] = 0.5
    assert (await env.run(prometheus_query, PrometheusQueryInput(endpoint=url, query="up"))).value == 1
    assert len(beats) >= 3, beats  # every 0.1 s of the 0.5 s wait
    env, beats = _env(timedelta(seconds=0.3))
    delay[0] = 0.0
    assert (await env.run(prometheus_query, PrometheusQueryInput(endpoint=url, query="up"))).value == 1
    assert beats == []  # answered before the first third: no heartbeat for the server


def _soaked_actions() -> list[str]:
    """Every action the soak's runbooks and the drain runbook run (bench/soak.py's BOOKS)."""
    root = Path(__file__).resolve().parent.parent
    books = [root / "runbooks" / "demo.yaml", root / "bench" / "soak-drain.yaml", root / "runbooks" / "preempted-host-drain.yaml"]
    return sorted({name for book in books for name in re.findall(r"^\s*(?:- )?action: ([\w.]+)", book.read_text(), re.MULTILINE)})


@pytest.mark.parametrize("name", _soaked_actions())
def test_a_lost_workers_attempt_is_given_to_another_within_the_soaks_recovery_goal(name):
    # The server notices a lost attempt at its heartbeat timeout (else its start-to-close one) and runs
    # the next after the first retry interval.
    spec = load_registry().specs[name]
    noticed = spec.heartbeat or spec.timeout
    assert noticed + spec.retry.delay(1) < RECOVERY_GOAL


def test_the_soaked_actions_include_the_drain_and_the_demo():
    assert {WAIT.name, PROMETHEUS_QUERY.name, NOTE.name, "containers.kill_inits", "sessions.release",
            "dns.steer.get"} <= set(_soaked_actions())


async def test_a_heartbeating_action_beats_every_third_of_its_timeout_and_a_quick_one_not_at_all():
    @heartbeating
    async def slow(seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    env, beats = _env(timedelta(seconds=0.3))
    assert await env.run(slow, 0.45) == 0.45
    assert len(beats) >= 3, beats  # at 0.1, 0.2, 0.3 and 0.4 s, a loaded machine may lose one
    env, beats = _env(timedelta(seconds=0.3))
    await env.run(slow, 0.0)
    assert beats == []
    env, beats = _env(None)  # no heartbeat timeout: nothing to beat for
    await env.run(slow, 0.2)
    assert beats == []


async def test_the_controller_worker_forwards_a_waits_heartbeats_well_inside_its_timeout(env, tmp_path, task_queue):
    """The server sees a 10 s heartbeat timeout's beats every few seconds, not every 8 s (the SDK's default
    forwarding, 0.8 x the timeout), so a wait on a busy live worker keeps its slack and is not given away."""
    from temporalio.api.enums.v1 import PendingActivityState

    from runtime.worker import HEARTBEAT_FORWARD_EVERY
    from tests import support

    assert WAIT.heartbeat is not None and HEARTBEAT_FORWARD_EVERY < WAIT.heartbeat * 0.8
    sdk_default_every = WAIT.heartbeat.total_seconds() * 0.8  # 8 s
    book = support.write_runbook(tmp_path, """\
        version: 1
        metadata: {name: beats}
        target: local
        steps:
          - id: settle
            action: core.wait
            with: {seconds: 9}
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        beats: set[datetime] = set()  # the attempt's last heartbeat as the server holds it, sampled
        while not (described := await handle.describe()).status or described.status.name == "RUNNING":
            pending = described.raw_description.pending_activities
            if pending and pending[0].state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED \
                    and pending[0].HasField("last_heartbeat_time"):
                beats.add(pending[0].last_heartbeat_time.ToDatetime())
            await asyncio.sleep(0.5)
        await handle.result()
    # The wait beats every 2 s. Forwarded at most every 3 s, the server holds beats from 2, 5 and 8 s into the
    # 9 s wait; forwarded every 8 s (the SDK's default for a 10 s timeout), only the one from 2 s: the next
    # would come at 10 s, 2 s before the server gives the attempt away.
    assert sdk_default_every == 8 and len(beats) >= 2, sorted(beats)


async def test_every_activity_a_run_schedules_is_noticed_lost_within_the_soaks_recovery_goal(env, tmp_path, task_queue):
    """The run's own activities too (resolving its request against the catalog, first of all), read from a
    run's history: a lost attempt is noticed at its heartbeat timeout, else its start-to-close one."""
    from temporalio.api.enums.v1 import EventType

    from tests import support

    book = support.write_runbook(tmp_path, """\
        version: 1
        metadata: {name: lost}
        target: local
        steps:
          - id: settle
            action: core.wait
            with: {seconds: 0}
          - id: say
            action: core.note
            with: {message: done}
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        await handle.result()
        history = await handle.fetch_history()
    scheduled = [e.activity_task_scheduled_event_attributes for e in history.events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    assert {a.activity_type.name for a in scheduled} >= {"coldstart.resolve_run", WAIT.name, NOTE.name}
    for attributes in scheduled:
        timeout = attributes.heartbeat_timeout if attributes.HasField("heartbeat_timeout") \
            and attributes.heartbeat_timeout.ToTimedelta() else attributes.start_to_close_timeout
        retry = attributes.retry_policy.initial_interval.ToTimedelta()
        assert timeout.ToTimedelta() + retry < RECOVERY_GOAL, (attributes.activity_type.name, timeout.ToTimedelta())


async def test_resolving_a_run_heartbeats_while_the_catalog_is_slow():
    import time

    from runtime.catalog import RunResolver

    class SlowCatalog:
        def resolve(self, request: object, registry: object, workflow_id: str) -> SimpleNamespace:
            time.sleep(0.45)  # in its thread: the activity's loop keeps beating
            return SimpleNamespace(target_name=f"target of {workflow_id}")

    async def free(target: str, workflow_id: str) -> None:
        return None

    env, beats = _env(timedelta(seconds=0.3))
    resolver = RunResolver(SlowCatalog(), None, others=free)  # type: ignore[arg-type]
    assert (await env.run(resolver.resolve, object())).target_name == "target of test"  # type: ignore[arg-type]
    assert len(beats) >= 3, beats
