"""FairPace: a worker's readings at its rate, evenly spaced, handed to runs in turn, yielding to its steps."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.testing import ActivityEnvironment

from activities.contracts.telemetry import (
    MAX_READS_PER_BATCH,
    READ_MANY_TIMEOUT,
    WAITED_IN_READING,
    GateRead,
    ReadManyInput,
)
from activities.pacing import FairPace
from activities.telemetry import pace_readings, read_many, wait_before
from runtime.shedding import READINGS_SLOWED
from runtime.step_load import StepLoad
from runtime.worker import READINGS_PER_SECOND_ENV, READINGS_SHARE_ENV, reading_settings, readings_in_flight


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


async def test_each_worker_reads_at_its_own_pace_found_by_its_task_queue():
    """Two workers in one process, one reading 4 a second, one 1000: the slow one's rate is not the fast one's."""
    pace_readings(4, "slow-runs", "slow-runs-readings")
    pace_readings(1000, "fast-runs", "fast-runs-readings")
    loop = asyncio.get_running_loop()
    unreachable = ReadManyInput(reads=[GateRead(source="http", endpoint="http://127.0.0.1:9/", step="s", gate=f"g{i}",
                                                timeout_seconds=1) for i in range(5)])
    took = {}
    for queue in ("slow-runs-readings", "fast-runs-readings"):
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, task_queue=queue, workflow_id=f"run-{queue}")
        started = loop.time()
        readings = await env.run(read_many, unreachable)
        took[queue] = loop.time() - started
        assert [r.error for r in readings.readings] == ["http://127.0.0.1:9/ unreachable: ConnectError"] * 5
    # Five slots at 4 a second: the last a second after the first (a lower bound); at 1000, about 4 ms.
    assert took["slow-runs-readings"] >= 1.0 - 1e-3 > took["fast-runs-readings"], took


async def test_slots_are_spaced_by_the_share_of_the_run_they_go_to_and_a_yielding_run_holds_no_other_back():
    shares = {"yields": 0.25, "free": 1.0}
    slowed: list[str] = []
    pace = FairPace(per_second=40, share=shares.__getitem__, slowed=lambda: slowed.append("slot"))
    loop = asyncio.get_running_loop()
    times: dict[str, list[float]] = {"yields": [], "free": []}

    async def timed(key: str) -> None:
        await pace.slot(key)
        times[key].append(loop.time())

    await asyncio.gather(*(timed(key) for key in ["yields", "free"] * 3))
    # A slot for `free` 25 ms after the last one (40 a second), for `yields` 100 ms (a quarter of it): `free`
    # takes its three slots while `yields` waits out its spacing, instead of each waiting behind the other.
    assert times["free"][-1] - times["free"][0] < 0.1, times
    assert all(b - a >= 0.1 - 1e-3 for a, b in zip(times["yields"], times["yields"][1:], strict=False)), times
    assert times["free"][-1] < times["yields"][-1], times
    assert slowed == ["slot"] * 3  # each of `yields`' slots, none of `free`'s


async def test_a_share_that_rises_while_a_run_waits_shortens_its_wait():
    now = {"share": 0.05}
    pace = FairPace(per_second=10, share=lambda _key: now["share"])
    loop = asyncio.get_running_loop()
    await pace.slot("run")
    started = loop.time()
    waiting = asyncio.ensure_future(pace.slot("run"))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # 2 s apart at a twentieth of 10 a second
    now["share"] = 1.0  # the steps it yielded to ended
    await asyncio.wait_for(waiting, timeout=1.0)
    assert loop.time() - started < 0.5


def test_step_load_gives_readings_a_quarter_for_a_second_after_a_step_and_counts_them():
    now = [100.0]
    load = StepLoad(window=1.0, clock=lambda: now[0])
    slowed = READINGS_SLOWED.value("steps_running")
    assert load.share() == 1.0
    load.note()
    now[0] = 100.9
    assert load.share() == 0.25 == StepLoad.SHARE
    now[0] = 101.0
    assert load.share() == 1.0
    load.slowed()  # the pace calls it for each slot it gives at a share below 1
    assert READINGS_SLOWED.value("steps_running") == slowed + 1


def test_a_runs_readings_yield_to_other_runs_steps_not_to_its_own():
    now = [100.0]
    load = StepLoad(window=1.0, clock=lambda: now[0])
    load.note("drain")
    assert load.share("drain") == 1.0  # its own step just ended: it is waiting on this gate
    assert load.share("other") == StepLoad.SHARE and load.share() == StepLoad.SHARE
    load.note("other")
    assert load.share("drain") == StepLoad.SHARE  # another run's step is running
    now[0] = 101.5
    assert load.share("drain") == load.share("other") == 1.0


def test_the_step_load_keeps_only_the_runs_inside_its_window():
    now = [0.0]
    load = StepLoad(window=1.0, clock=lambda: now[0])
    for n in range(500):
        now[0] = n * 0.1
        load.note(f"run-{n}")
    assert len(load._last) <= 75  # the ten runs inside the last second, plus at most 64 before a pruning
    assert load.share("run-499") == StepLoad.SHARE  # run-490 to run-498 are inside the window


def test_the_readings_pace_and_share_come_from_the_environment_and_bad_values_are_named():
    assert reading_settings({}) == (10.0, 0.25)
    assert reading_settings({READINGS_PER_SECOND_ENV: "4", READINGS_SHARE_ENV: "0.1"}) == (4.0, 0.1)
    for name, raw in [(READINGS_SHARE_ENV, "0"), (READINGS_SHARE_ENV, "1.5"), (READINGS_PER_SECOND_ENV, "-1"),
                      (READINGS_PER_SECOND_ENV, "fast"), (READINGS_PER_SECOND_ENV, "inf"), (READINGS_SHARE_ENV, "nan")]:
        with pytest.raises(ValueError, match=rf"^\${name} must be a number (in \(0, 1\]|above 0), not '{raw}'$"):
            reading_settings({name: raw})


def test_a_reading_waits_until_its_not_before_at_most_the_longest_wait_kept_in_a_reading():
    now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    assert wait_before(now + timedelta(seconds=0.25), now) == 0.25
    assert wait_before(now - timedelta(seconds=3), now) == 0.0  # due already (it waited in the server)
    # A worker clock behind the server's cannot hold an activity slot past what a timer would have cost.
    assert wait_before(now + timedelta(minutes=5), now) == WAITED_IN_READING.total_seconds() == 1.0


def test_the_full_batches_a_worker_holds_are_read_within_read_manys_timeout_at_the_default_share():
    """At 10 a second and the default share while steps run, every batch in flight, each full, is read
    before telemetry.read_many's timeout: none of their gates reads a timeout instead of a value."""
    rate, share = reading_settings({})
    in_flight = readings_in_flight(rate, share)
    slowest = in_flight * MAX_READS_PER_BATCH / (rate * share)
    assert in_flight >= 3 and slowest < READ_MANY_TIMEOUT.total_seconds(), (in_flight, slowest)


async def test_a_batch_waiting_for_its_slots_heartbeats_and_one_read_at_once_does_not():
    """A batch's heartbeats come every third of its heartbeat timeout while it waits (the server then
    finds a lost worker in that timeout, not read_many's whole one); a batch read at once sends none."""
    pace_readings(1000, "beats-fast-readings")
    pace_readings(3, "beats-slow-readings")
    unreachable = ReadManyInput(reads=[GateRead(source="http", endpoint="http://127.0.0.1:9/", step="s", gate=f"g{i}",
                                                timeout_seconds=1) for i in range(6)])
    beats = {}
    for queue in ("beats-fast-readings", "beats-slow-readings"):
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, task_queue=queue, workflow_id=f"run-{queue}",
                                       heartbeat_timeout=timedelta(seconds=1.5))
        sent: list[tuple] = []
        env.on_heartbeat = lambda *details, sent=sent: sent.append(details)
        await env.run(read_many, unreachable)
        beats[queue] = len(sent)
    # Six slots at 3 a second take 1.67 s at least: heartbeats at 0.5 s, 1 s, 1.5 s (3 or more); the
    # fast batch is read in milliseconds, long before its first 0.5 s.
    assert beats["beats-fast-readings"] == 0 and beats["beats-slow-readings"] >= 3, beats
