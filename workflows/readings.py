"""ReadingBatch: the gate readings a run asks for at one moment, read by one activity, and their shared tick."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow

__all__ = ["ReadingBatch"]

ReadMany = Callable[[list[dict[str, Any]]], Awaitable[list[dict[str, Any]]]]
Sleep = Callable[[timedelta, str], Awaitable[None]]


class ReadingBatch:
    """Gathers the reads that a run's gates ask for in one workflow activation into telemetry.read_many
    calls of at most `most` reads, and lets gates due again after the same interval share one timer.

    Fifty parallel gates then cost the server one activity and one timer a tick instead of fifty of
    each. Deterministic: which reads share a call depends only on the order the run's coroutines ran."""

    def __init__(self, read_many: ReadMany, sleep: Sleep, *, most: int) -> None:
        self._read_many = read_many
        self._sleep = sleep
        self._most = most
        self._asked: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]] = []
        self._calls: set[asyncio.Task[None]] = set()
        self._ticks: dict[tuple[timedelta, datetime], asyncio.Task[None]] = {}

    async def read(self, request: dict[str, Any]) -> dict[str, Any]:
        """One gate's sample (telemetry.read's result), read with whatever else was asked meanwhile."""
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._asked.append((request, answer))
        if len(self._asked) == 1:
            self._start(self._gather())
        return await answer

    async def tick(self, interval: timedelta, summary: str) -> None:
        """Sleep `interval`; gates that ask for the same interval at the same moment share the timer
        (the first one's `summary` names it)."""
        key = (interval, workflow.now())
        self._ticks = {k: t for k, t in self._ticks.items() if not t.done()}
        if key not in self._ticks:
            self._ticks[key] = asyncio.ensure_future(self._sleep(interval, summary))
        # Shielded: a gate cancelled mid-wait (its parallel branch ended) must not cancel the others' timer.
        await asyncio.shield(self._ticks[key])

    async def _gather(self) -> None:
        # A condition is checked once every coroutine this activation woke has run to its next wait,
        # so by then every gate due now has asked.
        await workflow.wait_condition(lambda: True)
        asked, self._asked = self._asked, []
        for start in range(0, len(asked), self._most):
            self._start(self._call(asked[start:start + self._most]))

    async def _call(self, part: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]]) -> None:
        try:
            results = await self._read_many([request for request, _ in part])
        except Exception as exc:  # noqa: BLE001 - passed on to every gate that asked
            # The activity failed as a whole: each gate sees it as its reading's failure.
            for _, answer in part:
                if not answer.done():
                    answer.set_exception(exc)
            return
        for (_, answer), result in zip(part, results, strict=True):
            if not answer.done():
                answer.set_result(result)

    def _start(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)
