"""Contracts of the gate readings: one sample, or a batch of them a run's gates asked for together."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import Field

from activities.contracts.model import ContractModel
from activities.registry import declare
from activities.retry import Retry

__all__ = [
    "MAX_READS_PER_BATCH",
    "READ",
    "READ_ACTION",
    "READ_ACTIONS",
    "READ_MANY",
    "READ_MANY_ACTION",
    "READ_MANY_HEARTBEAT",
    "READ_MANY_TIMEOUT",
    "WAITED_IN_READING",
    "GateRead",
    "ReadInput",
    "ReadManyInput",
    "Reading",
    "Readings",
]

# A batch waits for its slots inside its activity: runtime/worker.py keeps no more in flight than the
# slowest pace reads in half of read_many's timeout (and at least 3).
MAX_READS_PER_BATCH = 20


# read_many's start-to-close timeout: three full batches in flight read at a twentieth of 10 a second
# (while steps run) take 120 s. Its heartbeat, sent every third of READ_MANY_HEARTBEAT while the batch
# waits, finds a lost worker within it: the gate then reads again at its next interval, instead of every
# run with a read in flight on a lost worker standing still for the whole heartbeat timeout.
READ_MANY_TIMEOUT = timedelta(seconds=180)
READ_MANY_HEARTBEAT = timedelta(seconds=10)


# The actions gates read through: read_many takes the reads a run asked for together (batched
# readings); read, one a call, is what runs from before batched readings still schedule.
READ_ACTION = "telemetry.read"
READ_MANY_ACTION = "telemetry.read_many"
READ_ACTIONS = (READ_ACTION, READ_MANY_ACTION)


# A gate's wait for its next reading shorter than this is waited here, in the reading, not on a server
# timer: Temporal fires a sub-second timer about a second late, and a timer costs the
# server two workflow tasks a reading that the worker's pace does not govern, so after a burst of
# readings the server still works through their timers while the worker's steps run (bench/shedding.py).
WAITED_IN_READING = timedelta(seconds=1)


class ReadInput(ContractModel):
    """Where one gate sample comes from: a PromQL query, or an HTTP endpoint whose status code is the value."""

    source: Literal["prometheus", "http"]
    endpoint: str
    query: str = ""
    timeout_seconds: float = 10.0


class Reading(ContractModel):
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


class ReadManyInput(ContractModel):
    """The samples a run's gates asked for at one moment (workflows/readings.py gathers them)."""

    reads: list[GateRead] = Field(min_length=1, max_length=MAX_READS_PER_BATCH)


class Readings(ContractModel):
    readings: list[Reading]


READ = declare(
    READ_ACTION, ReadInput, Reading, timeout=30, retry=Retry(max_attempts=1),
    doc="""Read one gate sample; an unreachable source or an empty result is an error, so the gate fails closed.""",
)


READ_MANY = declare(
    READ_MANY_ACTION, ReadManyInput, Readings, timeout=READ_MANY_TIMEOUT, heartbeat=READ_MANY_HEARTBEAT, retry=Retry(max_attempts=1),
    doc="""Read several gates' samples, in the order given, each as telemetry.read would, at the worker's pace
    and none before its `not_before`.""",
)
