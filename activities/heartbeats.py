"""Heartbeats while an activity waits on I/O: a lost worker's attempt then goes to another at the heartbeat timeout, not the start-to-close one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from temporalio import activity

__all__ = ["beating"]


@contextlib.asynccontextmanager
async def beating() -> AsyncIterator[None]:
    """Heartbeat every third of the activity's heartbeat timeout while the block runs. None before the
    first third, so a call that answers at once (most do) costs the server no heartbeat; none outside an
    activity or without a heartbeat timeout."""
    beats = asyncio.create_task(_beat())
    try:
        yield
    finally:
        beats.cancel()


async def _beat() -> None:
    timeout = activity.info().heartbeat_timeout if activity.in_activity() else None
    if not timeout:
        return
    every = timeout.total_seconds() / 3
    while True:
        await asyncio.sleep(every)
        activity.heartbeat()
