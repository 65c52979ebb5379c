"""Heartbeats while an activity waits on I/O: a lost worker's attempt then goes to another at the heartbeat timeout, not the start-to-close one."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import ParamSpec, TypeVar

from temporalio import activity

__all__ = ["beating", "heartbeating"]

P = ParamSpec("P")
R = TypeVar("R")


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


def heartbeating(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """An async action run inside beating(): declared with a heartbeat timeout, an attempt lost with its
    worker is given to another within it, however long the action's start-to-close timeout."""
    @functools.wraps(fn)
    async def run(*args: P.args, **kwargs: P.kwargs) -> R:
        async with beating():
            return await fn(*args, **kwargs)
    return run
