"""Built-in actions: wait, note, HTTP check and Prometheus query."""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities._http import async_client
from activities.prometheus import PrometheusError, instant_query, single_value
from activities.registry import action
from activities.retry import Retry

__all__ = [
    "HttpCheckInput",
    "HttpCheckOutput",
    "NoteInput",
    "NoteOutput",
    "PrometheusQueryInput",
    "PrometheusQueryOutput",
    "WaitInput",
    "WaitOutput",
    "http_check",
    "note",
    "prometheus_query",
    "wait",
]


class WaitInput(BaseModel):
    seconds: float = Field(ge=0, le=7 * 24 * 3600)
    heartbeat_every: float = Field(default=2.0, gt=0)


class WaitOutput(BaseModel):
    waited_seconds: float


@action("core.wait", timeout=7 * 24 * 3600, heartbeat=30)
async def wait(inp: WaitInput) -> WaitOutput:
    """Wait inside an activity, heartbeating; a retried attempt resumes from its last heartbeat."""
    details = activity.info().heartbeat_details
    done = float(details[0]) if details else 0.0
    while done < inp.seconds:
        step = min(inp.heartbeat_every, inp.seconds - done)
        await asyncio.sleep(step)
        done += step
        activity.heartbeat(done)
    return WaitOutput(waited_seconds=done)


class NoteInput(BaseModel):
    message: str = Field(min_length=1, max_length=4000)
    level: Literal["info", "warning"] = "info"
    journal: str | None = Field(default=None, description="JSONL journal file; default $COLDSTART_JOURNAL")


class NoteOutput(BaseModel):
    key: str
    written: bool
    journal: str


def _journal_path(explicit: str | None) -> Path:
    return Path(explicit or os.environ.get("COLDSTART_JOURNAL", ".state/journal.jsonl"))


@action("core.note", timeout=30, mutating=True)
def note(inp: NoteInput) -> NoteOutput:
    """Record a note in the run journal, once per run and step (a retried attempt does not write twice)."""
    info = activity.info()
    key = f"{info.workflow_id}/{info.activity_id}"
    path = _journal_path(inp.journal)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        for line in path.read_text().splitlines():
            if line and json.loads(line).get("key") == key:
                return NoteOutput(key=key, written=False, journal=str(path))
    entry = {
        "key": key,
        "at": datetime.now(UTC).isoformat(),
        "level": inp.level,
        "message": inp.message,
        "workflow_id": info.workflow_id,
        "run_id": info.workflow_run_id,
    }
    with path.open("a") as handle:
        handle.write(json.dumps(entry) + "\n")
    activity.logger.info(inp.message)
    return NoteOutput(key=key, written=True, journal=str(path))


class HttpCheckInput(BaseModel):
    url: str = Field(pattern=r"^https?://")
    expect_status: list[int] = Field(default_factory=lambda: [200])
    contains: str | None = None
    timeout_seconds: float = Field(default=5.0, gt=0, le=120)


class HttpCheckOutput(BaseModel):
    status: int
    latency_ms: float


@action("core.http_check", timeout=60, retry=Retry(max_attempts=3))
async def http_check(inp: HttpCheckInput) -> HttpCheckOutput:
    """GET a URL and require an expected status (and optionally a substring in the body)."""
    started = time.monotonic()
    try:
        async with async_client(inp.timeout_seconds) as client:
            response = await client.get(inp.url)
    except httpx.HTTPError as exc:
        raise ApplicationError(f"{inp.url} unreachable: {type(exc).__name__}: {exc}") from None
    latency = (time.monotonic() - started) * 1000
    if response.status_code not in inp.expect_status:
        raise ApplicationError(f"{inp.url} answered {response.status_code}, expected {inp.expect_status}")
    if inp.contains is not None and inp.contains not in response.text:
        raise ApplicationError(f"{inp.url} body does not contain {inp.contains!r}")
    return HttpCheckOutput(status=response.status_code, latency_ms=round(latency, 2))


class PrometheusQueryInput(BaseModel):
    endpoint: str = Field(pattern=r"^https?://", description="Prometheus base URL")
    query: str = Field(min_length=1)
    timeout_seconds: float = Field(default=10.0, gt=0, le=120)


class PrometheusQueryOutput(BaseModel):
    value: float
    series: list[dict[str, Any]]


@action("core.prometheus_query", timeout=60, retry=Retry(max_attempts=3))
async def prometheus_query(inp: PrometheusQueryInput) -> PrometheusQueryOutput:
    """Run an instant PromQL query; the output is its single value (an empty result is an error)."""
    try:
        data = await instant_query(inp.endpoint, inp.query, timeout=inp.timeout_seconds)
        value = single_value(data)
    except PrometheusError as exc:
        raise ApplicationError(str(exc)) from None
    series = data["result"] if data.get("resultType") == "vector" else []
    return PrometheusQueryOutput(value=value, series=series)
