"""FairPace: a worker's gate readings at a bounded rate, handed out to runs in turn."""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Callable

__all__ = ["FairPace"]


class _Turns:
    """One event loop's waiting readings: a queue per key, and the keys in their turn."""

    def __init__(self) -> None:
        self.waiting: dict[str, deque[asyncio.Future[None]]] = {}
        self.order: deque[str] = deque()
        self.next_free = 0.0
        self.granting: asyncio.Task[None] | None = None


class FairPace:
    """At most `per_second` slots a second, evenly spaced, given round-robin over keys (a run's id).

    A run that asks for fifty readings at once gets one slot in each turn, as does a run asking for
    one, so a batch of readings cannot starve another run's gate. Each event loop paces on its own."""

    def __init__(self, per_second: float, *, share: Callable[[], float] = lambda: 1.0) -> None:
        self.per_second = per_second
        # The part of the pace readings may take right now, asked at each slot (the worker's StepLoad:
        # a twentieth while it runs steps, so readings yield to them).
        self.share = share
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Turns] = weakref.WeakKeyDictionary()

    async def slot(self, key: str) -> None:
        """Wait for this key's next turn; a cancelled waiter gives its turn up unused."""
        loop = asyncio.get_running_loop()
        turns = self._loops.setdefault(loop, _Turns())
        granted: asyncio.Future[None] = loop.create_future()
        if key not in turns.waiting:
            turns.waiting[key] = deque()
            turns.order.append(key)
        turns.waiting[key].append(granted)
        if turns.granting is None or turns.granting.done():
            turns.granting = loop.create_task(self._grant(loop, turns))
        await granted

    async def _grant(self, loop: asyncio.AbstractEventLoop, turns: _Turns) -> None:
        while turns.order:
            wait = turns.next_free - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            key = turns.order.popleft()
            queue = turns.waiting[key]
            granted = queue.popleft()
            if queue:
                turns.order.append(key)
            else:
                del turns.waiting[key]
            if granted.done():  # cancelled while waiting: the slot goes to the next in turn
                continue
            granted.set_result(None)
            turns.next_free = max(loop.time(), turns.next_free) + 1 / (self.per_second * self.share())
