"""Time seam: the stand-ins read time and inject latency only through a Clock."""

from __future__ import annotations

import asyncio
import threading
import time

__all__ = ["Clock", "FakeClock", "RealClock"]


class Clock:
    """Interface: `time()` is epoch seconds for rates, windows and timestamps;
    `sleep()` is how modelled latency is served to a waiting client."""

    def time(self) -> float:  # pragma: no cover - interface
        raise NotImplementedError

    async def sleep(self, seconds: float) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class RealClock(Clock):
    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds)


class FakeClock(Clock):
    """Manually advanced clock for tests.

    `sleep()` does not wait: modelled latency is recorded in `slept` so a test can
    assert on it without spending wall time. Thread-safe because tests drive the
    clock from the pytest thread while the server loop runs in another.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        self.slept: list[float] = []

    def time(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    async def sleep(self, seconds: float) -> None:
        with self._lock:
            self.slept.append(seconds)
        await asyncio.sleep(0)
