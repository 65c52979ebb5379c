"""Reading a run's status without hammering Temporal: backoff with jitter when refused, the Query only when the run moved."""

from __future__ import annotations

import asyncio
import random
import time
from datetime import timedelta
from typing import Any, Awaitable, Callable

from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from workflows.contract import RunStatus

__all__ = ["RunWatch", "Sleep", "read_status", "refused"]

Sleep = Callable[[float], Awaitable[Any]]

_REFUSALS = frozenset({RPCStatusCode.RESOURCE_EXHAUSTED, RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED})
# A Query runs on the worker (on a closed run it replays the whole history there): bound each one.
_QUERY_TIMEOUT = timedelta(seconds=30)
_FIRST_BACKOFF, _MAX_BACKOFF = 0.5, 10.0


def refused(exc: BaseException) -> bool:
    """Temporal is overloaded, away or too slow (the frontend, or the worker behind a Query): try later."""
    if not isinstance(exc, RPCError):
        return False
    # A call that outlives its own rpc_timeout comes back CANCELLED "Timeout expired" (seen: one of
    # fifty views' Queries on a just-closed run, in CI), which is the same as DEADLINE_EXCEEDED here.
    return exc.status in _REFUSALS or (exc.status == RPCStatusCode.CANCELLED and exc.message == "Timeout expired")


def _retrying(attempts: int, sleep: Sleep) -> AsyncRetrying:
    # Full jitter: a reconnect storm of CLIs spreads out instead of coming back in lock step. The SDK
    # already retries each call for about 10 s; this spaces out the calls after it gives up.
    return AsyncRetrying(retry=retry_if_exception(refused), wait=wait_random_exponential(_FIRST_BACKOFF, _MAX_BACKOFF),
                         stop=stop_after_attempt(attempts), sleep=sleep, reraise=True)


async def read_status(handle: WorkflowHandle, *, attempts: int = 6, sleep: Sleep = asyncio.sleep) -> RunStatus:
    """The run's status Query, tried again with backoff while Temporal refuses, at most `attempts` times."""
    return await _retrying(attempts, sleep)(handle.query, "status", result_type=RunStatus, rpc_timeout=_QUERY_TIMEOUT)


class RunWatch:
    """A run's status for a live view, at a cost the run does not feel.

    A Query is served by the worker, between the run's own workflow tasks, so a storm of followers
    querying twice a second each would delay the run they watch. The watch asks the server instead
    (describe(), which the worker never sees) every `interval`, jittered, and sends the status Query
    only when the run's history has grown since the last one (its status cannot have changed
    otherwise), at most once per `query_every`, jittered. The first call waits a random part of
    `interval`, so a reconnect storm of views does not reach the worker in the same instant. Refusals
    back off exponentially with full jitter (at most 10 s apart) and give up, raising, after
    `attempts` calls in a row were refused.
    """

    def __init__(self, handle: WorkflowHandle, *, interval: float = 0.5, query_every: float = 1.0,
                 attempts: int = 30, sleep: Sleep = asyncio.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        self._handle = handle
        self._interval = interval
        self._query_every = query_every
        self._retry = _retrying(attempts, sleep)
        self._sleep = sleep
        self._clock = clock
        self._length = -1
        self._queried_at = float("-inf")
        self._next_query_after = query_every
        self._last: RunStatus | None = None
        self._started = False

    async def next(self) -> RunStatus:
        """The run's status once it may have changed since the previous call."""
        if not self._started:
            self._started = True
            await self._sleep(self._interval * random.random())
        while True:
            description = await self._retry(self._handle.describe)
            length = description.raw_description.workflow_execution_info.history_length
            closed = description.status not in (None, WorkflowExecutionStatus.RUNNING)
            if length != self._length and (closed or self._clock() - self._queried_at >= self._next_query_after):
                self._last = await self._retry(self._handle.query, "status", result_type=RunStatus,
                                               rpc_timeout=_QUERY_TIMEOUT)
                self._length, self._queried_at = length, self._clock()
                self._next_query_after = self._query_every * random.uniform(0.5, 1.5)
                return self._last
            if closed and self._last is not None:
                if self._last.state not in ("running", "paused"):
                    return self._last
                # Closed from outside (terminated, timed out, cancelled): the run's own status never says so.
                return self._last.model_copy(update={"state": "failed", "error": f"the run was {description.status.name.lower()}"})
            await self._sleep(self._interval * random.uniform(0.5, 1.5))
