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
        self.last = float("-inf")  # when the last slot was given
        self.granting: asyncio.Task[None] | None = None


# While every waiting key must still wait, how often their shares are asked again (a share rises as the
# steps it yields to end).
_RECHECK_S = 0.1


class FairPace:
    """At most `per_second` slots a second, evenly spaced, given round-robin over keys (a run's id).

    A run that asks for fifty readings at once gets one slot in each turn, as does a run asking for
    one, so a batch of readings cannot starve another run's gate. Each event loop paces on its own.

    share(key): the part of the pace the key may take now (the worker's StepLoad: a quarter by default while the
    worker runs other runs' steps). A slot goes to a key once 1 / (per_second x share) has passed since the
    last slot; the first key in turn whose spacing has passed goes first, so a run whose readings need not
    yield is not held behind one whose readings must. slowed() is called for each slot given at a share
    below 1."""

    def __init__(self, per_second: float, *, share: Callable[[str], float] = lambda _key: 1.0,
                 slowed: Callable[[], None] = lambda: None) -> None:
        self.per_second = per_second
        self.share = share
        self.slowed = slowed
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
            now = loop.time()
            shares = {key: self.share(key) for key in turns.order}
            due = {key: turns.last + 1 / (self.per_second * share) for key, share in shares.items()}
            key = next((key for key in turns.order if due[key] <= now), None)
            if key is None:
                await asyncio.sleep(min(min(due.values()) - now, _RECHECK_S))
                continue
            turns.order.remove(key)
            queue = turns.waiting[key]
            granted = queue.popleft()
            if queue:
                turns.order.append(key)
            else:
                del turns.waiting[key]
            if granted.done():  # cancelled while waiting: the slot goes to the next in turn
                continue
            granted.set_result(None)
            turns.last = now
            if shares[key] < 1.0:
                self.slowed()
