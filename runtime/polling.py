"""Reading a run's status without hammering Temporal: backoff with jitter when refused, the Query only when the run moved."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from pydantic import ValidationError
from temporalio.client import (
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from workflows import search
from workflows.contract import RunResult, RunStatus, status_from_memo

__all__ = ["RunWatch", "Sleep", "read_full_status", "read_kept_status", "read_status", "refused"]

Sleep = Callable[[float], Awaitable[Any]]

_REFUSALS = frozenset({RPCStatusCode.RESOURCE_EXHAUSTED, RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED})
# A Query runs on the worker (on a closed run it replays the whole history there): bound each one.
_QUERY_TIMEOUT = timedelta(seconds=30)
_FIRST_BACKOFF, _MAX_BACKOFF = 0.5, 10.0
# A run that does not move (an approval, a hold) is read less often: each unchanged describe stretches
# the next wait by half, up to 6 s (or the interval, if longer), so a view sees it move within seconds.
_IDLE_GROWTH, _IDLE_MAX = 1.5, 6.0


def refused(exc: BaseException) -> bool:
    """Temporal is overloaded, away or too slow (the frontend, or the worker behind a Query): try later."""
    if not isinstance(exc, RPCError):
        return False
    # A call that outlives its own rpc_timeout comes back CANCELLED "Timeout expired" (seen: one of
    # fifty views' Queries on a just-closed run, in CI), which is the same as DEADLINE_EXCEEDED here.
    return exc.status in _REFUSALS or (exc.status == RPCStatusCode.CANCELLED and exc.message == "Timeout expired")


def _closed_as(description: WorkflowExecutionDescription) -> str:
    """How a run closed, in words: terminated, timed out, ..."""
    return description.status.name.lower() if description.status is not None else "closed"


def _retrying(attempts: int, sleep: Sleep) -> AsyncRetrying:
    # Full jitter: a reconnect storm of CLIs spreads out instead of coming back in lock step. The SDK
    # already retries each call for about 10 s; this spaces out the calls after it gives up.
    return AsyncRetrying(retry=retry_if_exception(refused), wait=wait_random_exponential(_FIRST_BACKOFF, _MAX_BACKOFF),
                         stop=stop_after_attempt(attempts), sleep=sleep, reraise=True)


async def read_status(handle: WorkflowHandle, *, attempts: int = 6, sleep: Sleep = asyncio.sleep) -> RunStatus:
    """The run's status Query, tried again with backoff while Temporal refuses, at most `attempts` times."""
    return await _retrying(attempts, sleep)(handle.query, "status", result_type=RunStatus, rpc_timeout=_QUERY_TIMEOUT)


async def read_kept_status(handle: WorkflowHandle, *, attempts: int = 6) -> RunStatus:
    """The status the run keeps in its memo (all but step outputs and older readings), from the
    server: a storm of one-shot reads costs the run's worker nothing. A run older than the memo is Queried."""
    return await RunWatch(handle, interval=0.2, attempts=attempts, spread_first=False).next()


async def read_full_status(handle: WorkflowHandle, *, attempts: int = 6) -> RunStatus:
    """All the status Query answers, step outputs included: a closed run's from its close event (the
    server; a Query would have the worker replay the whole run), a running run's from the Query."""
    description = await _retrying(attempts, asyncio.sleep)(handle.describe)
    if description.status in (None, WorkflowExecutionStatus.RUNNING):
        return await read_status(handle, attempts=attempts)  # the memo keeps no step outputs
    watch = RunWatch(handle, interval=0.2, attempts=attempts, spread_first=False, described=description, close_event=True)
    status = await watch.next()
    if watch.closed_with_result or watch.queried:
        return status
    # Closed from outside (terminated, timed out): no close event says how its steps ended.
    return await read_status(handle, attempts=attempts)


class RunWatch:
    """A run's status for a live view, at a cost the run does not feel.

    A Query is served by the worker, between the run's own workflow tasks (about 5 ms of its CPU
    each, and 5 more of the server's), so a storm of followers querying would delay the run they
    watch. The watch asks the server instead: describe() every `interval`, jittered, returns the
    status the run keeps in its memo (workflows/contract.status_memo), and the run's close event
    (its RunResult) says how it ended. Neither reaches the worker. Only a run started before the
    memo was kept is Queried, when its history has grown since the last Query (its status cannot
    have changed otherwise) and at most once per `query_every`, jittered. A run that ended itself put
    its last status in the memo in the workflow task that closed it, so a view ends on one describe;
    `close_event` reads the close event after it too, for what the memo leaves out (step outputs, all
    readings): about 2 ms of the server's CPU a read, as much as a describe, and fifty views ending
    at once each made one (bench/shedding.py). The first call waits a random part of
    `interval`, so a reconnect storm of views does not reach the worker in the same instant. Refusals
    back off exponentially with full jitter (at most 10 s apart) and give up, raising, after
    `attempts` calls in a row were refused. While the run does not move (its history length
    unchanged: waiting on an approval, held), each describe waits half as long again as the one
    before, up to `idle_max` (6 s unless given, never under `interval`): fifty views of a run waiting
    for its approver, reading every 3 s, make half the describes, and see it move again within that.
    """

    def __init__(self, handle: WorkflowHandle, *, interval: float = 0.5, query_every: float = 1.0,
                 attempts: int = 30, sleep: Sleep = asyncio.sleep, clock: Callable[[], float] = time.monotonic,
                 spread_first: bool = True, described: WorkflowExecutionDescription | None = None,
                 close_event: bool = False, idle_max: float | None = None) -> None:
        self._handle = handle
        self._interval = interval
        self._idle_max = max(interval, idle_max if idle_max is not None else _IDLE_MAX)
        self._query_every = query_every
        self._retry = _retrying(attempts, sleep)
        self._sleep = sleep
        self._clock = clock
        self._length = -1
        self._queried_at = float("-inf")
        self._next_query_after = query_every
        self._last: RunStatus | None = None
        self._spread_first = spread_first
        self._calls = 0
        # Whether the last status came from the run's close event, its RunResult (every step's outputs too).
        self.closed_with_result = False
        # Whether the last status was the run's status Query (a run from before the memo), outputs and all.
        self.queried = False
        self._described = described  # a description already read: the first call's
        self._close_event = close_event

    async def next(self) -> RunStatus:
        """The run's status once it may have changed since the previous call."""
        # One read per `interval` at most, however busy the run: the first after a random part of it
        # (unless spread_first is off: a one-shot read).
        if self._calls:
            await self._sleep(self._interval * random.uniform(0.5, 1.5))
        elif self._spread_first:
            await self._sleep(self._interval * random.random())
        self._calls += 1
        unmoved = 0  # describes in a row that found the run where it was
        while True:
            description, self._described = self._described or await self._retry(self._handle.describe), None
            self.queried = False
            length = description.raw_description.workflow_execution_info.history_length
            closed = description.status not in (None, WorkflowExecutionStatus.RUNNING)
            moved = length != self._length
            kept = None
            if moved and not (closed and self._last is not None and self._close_event):
                kept = status_from_memo(await description.memo())
                if kept is not None:
                    self._last, self._length = kept, length
                    if not closed:
                        return kept
            if closed and self._last is not None:
                return await self._closed(description)
            # Before its first workflow task a run has no memo yet (its step still reads "starting"); a run
            # started before the memo was kept never has one: ask the worker, as views did before.
            starting = not closed and description.typed_search_attributes.get(search.CURRENT_STEP) == "starting"
            if kept is None and moved and not starting and (
                    closed or self._clock() - self._queried_at >= self._next_query_after):
                self._last = queried = await self._retry(self._handle.query, "status", result_type=RunStatus,
                                                         rpc_timeout=_QUERY_TIMEOUT)
                self._length, self._queried_at = length, self._clock()
                self._next_query_after = self._query_every * random.uniform(0.5, 1.5)
                self.queried = True
                return queried
            unmoved = 0 if moved else unmoved + 1
            await self._sleep(self._idle_wait(unmoved))

    def _idle_wait(self, unmoved: int) -> float:
        """The wait before the next describe, jittered: `interval`, stretched while the run does not move."""
        return min(self._interval * _IDLE_GROWTH ** unmoved, self._idle_max) * random.uniform(0.5, 1.5)

    async def _closed(self, description: WorkflowExecutionDescription) -> RunStatus:
        """A closed run's status: the last its memo kept, if the run ended itself and the close event
        is not asked for; else from the close event, read from the server. Never a Query: on a closed
        run it has the worker replay all of it, and fifty views doing so as a run ends delayed the next run."""
        assert self._last is not None
        at_end = {"current_step": None, "awaiting_approval": [], "held": []}
        self.closed_with_result = False
        if not self._close_event and self._last.over:
            return self._last.model_copy(update={**at_end, "ended_at": self._last.ended_at or description.close_time})
        if description.status == WorkflowExecutionStatus.COMPLETED:
            result = _run_result(await self._retry(self._handle.result, follow_runs=False, rpc_timeout=_QUERY_TIMEOUT))
        elif description.status == WorkflowExecutionStatus.FAILED:
            result = await self._retry(self._failure)
        else:
            result = None
        self.closed_with_result = result is not None
        if result is None:
            # Closed from outside (terminated, timed out, cancelled): the run's own status never says so.
            return self._last.model_copy(update={
                **at_end, "state": "failed", "error": f"the run was {_closed_as(description)}",
                "ended_at": self._last.ended_at or description.close_time})
        return self._last.model_copy(update={
            **at_end, "state": result.state, "steps": result.steps, "error": result.error,
            "ended_at": result.ended_at or description.close_time, "controls": result.controls or self._last.controls})

    async def _failure(self) -> RunResult | None:
        """The RunResult a failed run raised (its ApplicationError's details); None if it failed otherwise."""
        try:
            await self._handle.result(follow_runs=False, rpc_timeout=_QUERY_TIMEOUT)
        except WorkflowFailureError as failure:
            cause = failure.cause
            if isinstance(cause, ApplicationError) and cause.details:
                return _run_result(cause.details[0])
        return None


def _run_result(value: Any) -> RunResult | None:
    """A RunResult from what the close event holds (the handle has no result type), None if it is not one."""
    try:
        return RunResult.model_validate(value)
    except ValidationError:
        return None
