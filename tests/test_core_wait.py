"""core.wait's heartbeats: often enough for its heartbeat timeout whatever a runbook asks, so a lost worker's wait moves on soon."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta

from temporalio.testing import ActivityEnvironment

from activities.contracts.core import WAIT, WaitInput
from activities.core import wait


def _env(heartbeat_timeout: timedelta | None, details: list[float] | None = None) -> tuple[ActivityEnvironment, list[float]]:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=heartbeat_timeout, heartbeat_details=details or [])
    beats: list[float] = []
    env.on_heartbeat = lambda *details: beats.append(asyncio.get_running_loop().time())
    return env, beats


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


def test_a_lost_workers_wait_is_given_to_another_within_the_soaks_recovery_goal():
    # The server notices the lost worker at the heartbeat timeout and retries after the first interval.
    assert WAIT.heartbeat is not None
    assert WAIT.heartbeat + WAIT.retry.delay(1) < timedelta(seconds=15)
