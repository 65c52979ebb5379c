"""Contracts of the built-in actions: wait, note, HTTP check and Prometheus query."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from pydantic import Field

from activities.contracts.model import ContractModel
from activities.registry import declare
from activities.retry import Retry

__all__ = [
    "HTTP_CHECK",
    "NOTE",
    "PROMETHEUS_QUERY",
    "WAIT",
    "HttpCheckInput",
    "HttpCheckOutput",
    "NoteInput",
    "NoteOutput",
    "PrometheusQueryInput",
    "PrometheusQueryOutput",
    "WaitInput",
    "WaitOutput",
]


class WaitInput(ContractModel):
    seconds: float = Field(ge=0, le=7 * 24 * 3600)
    heartbeat_every: float = Field(default=2.0, gt=0, description="seconds between heartbeats (at most a third of "
                                                                    "the heartbeat timeout, whatever this says)")


class WaitOutput(ContractModel):
    waited_seconds: float


class NoteInput(ContractModel):
    message: str = Field(min_length=1, max_length=4000)
    level: Literal["info", "warning"] = "info"
    journal: str | None = Field(default=None, description="JSONL journal file; default $COLDSTART_JOURNAL")


class NoteOutput(ContractModel):
    key: str
    written: bool
    journal: str


class HttpCheckInput(ContractModel):
    url: str = Field(pattern=r"^https?://")
    expect_status: list[int] = Field(default_factory=lambda: [200])
    contains: str | None = None
    timeout_seconds: float = Field(default=5.0, gt=0, le=120)


class HttpCheckOutput(ContractModel):
    status: int
    latency_ms: float


class PrometheusQueryInput(ContractModel):
    endpoint: str = Field(pattern=r"^https?://", description="Prometheus base URL")
    query: str = Field(min_length=1)
    timeout_seconds: float = Field(default=10.0, gt=0, le=120)


class PrometheusQueryOutput(ContractModel):
    value: float
    series: list[dict[str, Any]]


# A wait's heartbeat timeout is how long a run stands still when the worker running the wait dies: the
# server gives the wait to another worker only then (at 30 s, past bench/soak.py's 15 s recovery goal).
# The wait beats every 2 s by default, and never less often than a third of this.
WAIT = declare(
    "core.wait", WaitInput, WaitOutput, timeout=7 * 24 * 3600, heartbeat=10,
    doc="""Wait inside an activity, heartbeating; a retried attempt resumes from its last heartbeat.""",
)


# A note is a line in a local file (milliseconds): one lost with its worker is written by another after
# 10 s, inside bench/soak.py's 15 s recovery goal.
NOTE = declare(
    "core.note", NoteInput, NoteOutput, timeout=10, mutating=True,
    doc="""Record a note in the run journal, once per run and step (a retried attempt does not write twice).""",
)


HTTP_CHECK = declare(
    "core.http_check", HttpCheckInput, HttpCheckOutput, timeout=60, retry=Retry(max_attempts=3),
    doc="""GET a URL and require an expected status (and optionally a substring in the body).""",
)


# A query waits up to its timeout_seconds for Prometheus; it heartbeats meanwhile, so one lost with its
# worker is given to another after 10 s whatever it was allowed. Reading is safe to repeat, and a
# Prometheus restarting (or a scrape not yet in) is the common failure: attempts for about 45 s, 10 s apart at most.
PROMETHEUS_QUERY = declare(
    "core.prometheus_query", PrometheusQueryInput, PrometheusQueryOutput, timeout=60, heartbeat=10,
    retry=Retry(max_attempts=8, max_interval=timedelta(seconds=10)),
    doc="""Run an instant PromQL query; the output is its single value (an empty result is an error).""",
)
