"""StepLoad: whether a worker is running recovery steps, so that its gate readings yield to them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from activities.contracts.telemetry import READ_ACTIONS
from runtime.shedding import READINGS_SLOWED

__all__ = ["StepLoad", "StepLoadInterceptor"]


class StepLoad:
    """Notes each step a worker's activities start or finish. For `window` seconds after one, gate
    readings get `share` of the worker's pace (each such reading counted in READINGS_SLOWED), then all of it.

    Why: a reading costs the server about what a step does (a timer, two workflow tasks and an
    activity), so fifty runs each waiting on a gate, read at the full 10 a second, slowed a concurrent
    run's steps by a third on two cores; at a tenth of it, 1.01x at the median and 1.28x at p95
    (bench/shedding.py), and 1.13x at p95 in another 15 rounds, when one reading a
    second cost the server a tenth more work beside a run's steps (bench/reading_cost.py). A twentieth
    halves those readings; pooled over 55 rounds the spread flood reads 1.01x at p95 at it (bench/shedding.py, README).
    Readings are what can wait: a gate's interval is its fastest cadence, and a gate fails closed on
    its own timeout, never on a late reading."""

    SHARE = 0.05  # the default: $COLDSTART_READINGS_SHARE sets it for a worker (runtime/worker.py)

    def __init__(self, *, window: float = 1.0, share: float = SHARE, clock: Callable[[], float] = time.monotonic) -> None:
        self._window = window
        self.slowest_share = share  # what share() gives while steps run
        self._clock = clock
        self._last = float("-inf")

    def note(self) -> None:
        """A step's activity started or finished now."""
        self._last = self._clock()

    def share(self) -> float:
        """The part of the pace a reading granted now may take."""
        if self._clock() - self._last < self._window:
            READINGS_SLOWED.add("steps_running")
            return self.slowest_share
        return 1.0


class StepLoadInterceptor(Interceptor):
    """Worker interceptor noting every activity but a gate reading in a StepLoad."""

    def __init__(self, load: StepLoad) -> None:
        self._load = load

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _StepActivities(next, self._load)


class _StepActivities(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, load: StepLoad) -> None:
        super().__init__(next)
        self._load = load

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        step = activity.info().activity_type not in READ_ACTIONS
        if step:
            self._load.note()
        try:
            return await super().execute_activity(input)
        finally:
            if step:
                self._load.note()
