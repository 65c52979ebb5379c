"""Gate readings: samples of health signals, from Prometheus or an HTTP probe, paced per worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
from temporalio import activity

from activities._http import reading_client
from activities.binding import implements
from activities.contracts.telemetry import (
    READ,
    READ_MANY,
    WAITED_IN_READING,
    GateRead,
    Reading,
    Readings,
    ReadInput,
    ReadManyInput,
)
from activities.heartbeats import beating
from activities.pacing import FairPace
from activities.prometheus import PrometheusError, instant_query, single_value

__all__ = ["pace_readings", "read", "read_many", "wait_before"]

_DEFAULT_PER_SECOND = 10.0
# One pace per worker, found by the task queue a reading came from: two workers in one process keep
# their own rates.
_PACES: dict[str, FairPace] = {}


def pace_readings(per_second: float, *task_queues: str, share: Callable[[str], float] = lambda _key: 1.0,
                  slowed: Callable[[], None] = lambda: None) -> None:
    """The readings a second that gates read on these task queues take together, shared in turn by the
    runs asking (a worker sets it for the queues it reads on); elsewhere 10 a second. share: the part of
    that pace a run's readings may take at the moment, given its key; slowed: called per reading given
    less than all of it (activities/pacing.FairPace)."""
    pace = next((_PACES[queue] for queue in task_queues if queue in _PACES), None) or FairPace(per_second)
    pace.per_second, pace.share, pace.slowed = per_second, share, slowed
    for queue in task_queues:
        _PACES[queue] = pace


def _pace() -> FairPace:
    queue = activity.info().task_queue if activity.in_activity() else ""
    return _PACES.get(queue) or _PACES.setdefault("", FairPace(_DEFAULT_PER_SECOND))


@implements(READ)
async def read(inp: ReadInput) -> Reading:
    await _pace().slot(_run_key())
    return await _sample(inp)


@implements(READ_MANY)
async def read_many(inp: ReadManyInput) -> Readings:
    key, pace = _run_key(), _pace()

    async def paced(one: GateRead) -> Reading:
        if one.not_before is not None:
            await asyncio.sleep(wait_before(one.not_before, datetime.now(UTC)))
        await pace.slot(key)
        return await _sample(one)

    # A batch may wait a minute or two for its slots: its heartbeats tell the server the worker is alive.
    async with beating():
        return Readings(readings=list(await asyncio.gather(*(paced(one) for one in inp.reads))))


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
