"""FairPace: a worker's readings at its rate, evenly spaced, handed to runs in turn."""

from __future__ import annotations

import asyncio

from activities.pacing import FairPace


async def _take(pace: FairPace, key: str, order: list[str]) -> None:
    await pace.slot(key)
    order.append(key)


async def test_a_run_asking_for_many_slots_takes_turns_with_a_run_asking_for_one():
    pace = FairPace(per_second=200)
    order: list[str] = []
    flood = [asyncio.ensure_future(_take(pace, "flood", order)) for _ in range(6)]
    while not order:  # the flood asks first, and has its first slot
        await asyncio.sleep(0)
    quiet = [asyncio.ensure_future(_take(pace, "quiet", order)) for _ in range(2)]
    await asyncio.gather(*flood, *quiet)
    # First come, first served would give the quiet run slots 7 and 8.
    assert order == ["flood", "flood", "quiet", "flood", "quiet", "flood", "flood", "flood"]


async def test_slots_are_spaced_at_the_rate_and_a_cancelled_waiter_gives_its_turn_up():
    pace = FairPace(per_second=20)
    loop = asyncio.get_running_loop()
    times: list[float] = []

    async def timed(key: str) -> None:
        await pace.slot(key)
        times.append(loop.time())

    gone = asyncio.ensure_future(pace.slot("gone"))
    kept = [asyncio.ensure_future(timed("kept")) for _ in range(5)]
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(*kept)
    # Five slots 50 ms apart: the last no sooner than 200 ms after the first (a lower bound only).
    assert len(times) == 5
    assert times[-1] - times[0] >= 0.2 - 1e-3, times
    assert gone.cancelled()


async def test_each_event_loop_paces_on_its_own():
    pace = FairPace(per_second=1000)
    await pace.slot("a")
    done = asyncio.Event()

    def other_loop() -> None:
        asyncio.run(pace.slot("a"))
        done.set()

    await asyncio.to_thread(other_loop)
    assert done.is_set()
