"""Gate readings: samples of health signals, from Prometheus or an HTTP probe, paced per worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Literal

import httpx
from pydantic import BaseModel, Field
from temporalio import activity

from activities._http import reading_client
from activities.pacing import FairPace
from activities.prometheus import PrometheusError, instant_query, single_value
from activities.registry import action
from activities.retry import Retry

__all__ = [
    "MAX_READS_PER_BATCH",
    "READ_ACTION",
    "READ_ACTIONS",
    "READ_MANY_ACTION",
    "READ_MANY_TIMEOUT",
    "WAITED_IN_READING",
    "GateRead",
    "ReadInput",
    "ReadManyInput",
    "Reading",
    "Readings",
    "pace_readings",
    "read",
    "read_many",
    "wait_before",
]

# A batch waits for its slots inside its activity: runtime/worker.py keeps no more in flight than the
# slowest pace reads in half of read_many's timeout (and at least 3).
MAX_READS_PER_BATCH = 20
# read_many's start-to-close timeout: three full batches in flight read at a twentieth of 10 a second
# (while steps run) take 120 s. Its heartbeat, sent while the batch waits, still finds a lost worker
# in READ_MANY_HEARTBEAT.
READ_MANY_TIMEOUT = timedelta(seconds=180)
READ_MANY_HEARTBEAT = timedelta(seconds=30)
# The actions gates read through: read_many takes the reads a run asked for together (batched
# readings); read, one a call, is what runs from before batched readings still schedule.
READ_ACTION = "telemetry.read"
READ_MANY_ACTION = "telemetry.read_many"
READ_ACTIONS = (READ_ACTION, READ_MANY_ACTION)
_DEFAULT_PER_SECOND = 10.0
# A gate's wait for its next reading shorter than this is waited here, in the reading, not on a server
# timer: Temporal fires a sub-second timer about a second late, and a timer costs the
# server two workflow tasks a reading that the worker's pace does not govern, so after a burst of
# readings the server still works through their timers while the worker's steps run (bench/shedding.py).
WAITED_IN_READING = timedelta(seconds=1)
# One pace per worker, found by the task queue a reading came from: two workers in one process keep
# their own rates.
_PACES: dict[str, FairPace] = {}


def pace_readings(per_second: float, *task_queues: str, share: Callable[[], float] = lambda: 1.0) -> None:
    """The readings a second that gates read on these task queues take together, shared in turn by the
    runs asking (a worker sets it for the queues it reads on); elsewhere 10 a second. share: the part of
    that pace readings may take at the moment (activities/pacing.FairPace)."""
    pace = next((_PACES[queue] for queue in task_queues if queue in _PACES), None) or FairPace(per_second)
    pace.per_second, pace.share = per_second, share
    for queue in task_queues:
        _PACES[queue] = pace


def _pace() -> FairPace:
    queue = activity.info().task_queue if activity.in_activity() else ""
    return _PACES.get(queue) or _PACES.setdefault("", FairPace(_DEFAULT_PER_SECOND))


class ReadInput(BaseModel):
    """Where one gate sample comes from: a PromQL query, or an HTTP endpoint whose status code is the value."""

    source: Literal["prometheus", "http"]
    endpoint: str
    query: str = ""
    timeout_seconds: float = 10.0


class Reading(BaseModel):
    value: float | None = None
    error: str | None = None
    latency_ms: float = 0.0


class GateRead(ReadInput):
    """One sample of a batch, named for the step and gate it is for, so the history says whose it is."""

    step: str
    gate: str
    percent: int | None = None
    # Read no earlier than this (the gate's previous reading plus its interval, under WAITED_IN_READING).
    not_before: datetime | None = None


class ReadManyInput(BaseModel):
    """The samples a run's gates asked for at one moment (workflows/readings.py gathers them)."""

    reads: list[GateRead] = Field(min_length=1, max_length=MAX_READS_PER_BATCH)


class Readings(BaseModel):
    readings: list[Reading]


@action(READ_ACTION, timeout=30, retry=Retry(max_attempts=1))
async def read(inp: ReadInput) -> Reading:
    """Read one gate sample; an unreachable source or an empty result is an error, so the gate fails closed."""
    await _pace().slot(_run_key())
    return await _sample(inp)


@action(READ_MANY_ACTION, timeout=READ_MANY_TIMEOUT, heartbeat=READ_MANY_HEARTBEAT, retry=Retry(max_attempts=1))
async def read_many(inp: ReadManyInput) -> Readings:
    """Read several gates' samples, in the order given, each as telemetry.read would, at the worker's pace
    and none before its `not_before`."""
    key, pace = _run_key(), _pace()

    async def paced(one: GateRead) -> Reading:
        if one.not_before is not None:
            await asyncio.sleep(wait_before(one.not_before, datetime.now(UTC)))
        await pace.slot(key)
        return await _sample(one)

    beating = asyncio.create_task(_heartbeat_while_waiting())
    try:
        return Readings(readings=list(await asyncio.gather(*(paced(one) for one in inp.reads))))
    finally:
        beating.cancel()


async def _heartbeat_while_waiting() -> None:
    # A batch may wait a minute or two for its slots: its heartbeats tell the server the worker is alive.
    # None before the first interval, so a batch read at once (most are) costs the server no heartbeat.
    timeout = activity.info().heartbeat_timeout if activity.in_activity() else None
    if not timeout:
        return
    every = timeout.total_seconds() / 3
    while True:
        await asyncio.sleep(every)
        activity.heartbeat()


def wait_before(not_before: datetime, now: datetime) -> float:
    """Seconds from `now` to `not_before`, never below 0 nor past WAITED_IN_READING (this worker's clock
    may be behind the server's that set it)."""
    return max(0.0, min((not_before - now).total_seconds(), WAITED_IN_READING.total_seconds()))


def _run_key() -> str:
    return (activity.info().workflow_id or "") if activity.in_activity() else ""


async def _sample(inp: ReadInput) -> Reading:
    started = time.monotonic()
    try:
        if inp.source == "prometheus":
            value = single_value(await instant_query(inp.endpoint, inp.query, timeout=inp.timeout_seconds,
                                                     client=reading_client()))
        else:
            value = float((await reading_client().get(inp.endpoint, timeout=inp.timeout_seconds)).status_code)
    except PrometheusError as exc:
        return Reading(error=str(exc), latency_ms=(time.monotonic() - started) * 1000)
    except httpx.HTTPError as exc:
        return Reading(error=f"{inp.endpoint} unreachable: {type(exc).__name__}", latency_ms=(time.monotonic() - started) * 1000)
    return Reading(value=value, latency_ms=(time.monotonic() - started) * 1000)
