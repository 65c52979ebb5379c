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
    """Notes each step a worker's activities start or finish, by run. For `window` seconds after one, gate
    readings of every other run get `share` of the worker's pace (each reading so slowed is counted in
    READINGS_SLOWED by the pace, activities/pacing.FairPace), then all of it. A run's readings do not yield to its own steps: while it waits on its
    gate they would slow nothing but the run itself (a drain's gates, read right after its last step, waited
    2 s for their second slot behind a step that had already ended).

    Why: a reading costs the server about what a step does (a timer, two workflow tasks and an
    activity), so fifty runs each waiting on a gate, read at the full 10 a second, slowed a concurrent
    run's steps by a third on two cores; at a tenth of it, 1.01x at the median and 1.28x at p95
    (bench/shedding.py), and 1.13x at p95 in another 15 rounds, when one reading a
    second cost the server a tenth more work beside a run's steps (bench/reading_cost.py); at a quarter,
    50 runs of one gate read 1.04x / 1.18x and one run's 50 gates 1.01x / 1.05x, no more than at a twentieth
    within the bench's noise (bench/shedding.py, README). A fleet is why it is a quarter, not less: when every
    run is stepping every run's readings yield, and at a twentieth 50 runs' gate reads waited up to 36 s in the
    readings' queue; at a quarter every fault of the soak was recovered from within 11 s (bench/soak.py).
    Readings are what can wait: a gate's interval is its fastest cadence, and a gate fails closed on
    its own timeout, never on a late reading."""

    SHARE = 0.25  # the default: $COLDSTART_READINGS_SHARE sets it for a worker (runtime/worker.py)

    def __init__(self, *, window: float = 1.0, share: float = SHARE, clock: Callable[[], float] = time.monotonic) -> None:
        self._window = window
        self.slowest_share = share  # what share() gives while steps run
        self._clock = clock
        self._last: dict[str, float] = {}  # run (workflow id) -> when one of its steps last started or ended

    def note(self, run: str = "") -> None:
        """A step's activity of `run` started or finished now."""
        now = self._clock()
        self._last[run] = now
        if len(self._last) > 64:  # only the runs inside the window matter
            self._last = {key: at for key, at in self._last.items() if now - at < self._window}

    def share(self, run: str | None = None) -> float:
        """The part of the pace a reading of `run` may take now (None: any run's steps count)."""
        now = self._clock()
        if any(now - at < self._window for key, at in self._last.items() if key != run):
            return self.slowest_share
        return 1.0

    @staticmethod
    def slowed() -> None:
        """A reading was given a slot at less than the whole pace."""
        READINGS_SLOWED.add("steps_running")


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
        info = activity.info()
        step = info.activity_type not in READ_ACTIONS
        run = info.workflow_id or ""
        if step:
            self._load.note(run)
        try:
            return await super().execute_activity(input)
        finally:
            if step:
                self._load.note(run)
