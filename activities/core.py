"""Built-in actions: wait, note, HTTP check and Prometheus query."""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities._http import async_client
from activities.binding import implements
from activities.contracts.core import (
    HTTP_CHECK,
    NOTE,
    PROMETHEUS_QUERY,
    WAIT,
    HttpCheckInput,
    HttpCheckOutput,
    NoteInput,
    NoteOutput,
    PrometheusQueryInput,
    PrometheusQueryOutput,
    WaitInput,
    WaitOutput,
)
from activities.heartbeats import beating
from activities.prometheus import PrometheusError, instant_query, single_value

__all__ = ["http_check", "note", "prometheus_query", "wait"]


@implements(WAIT)
async def wait(inp: WaitInput) -> WaitOutput:
    info = activity.info()
    details = info.heartbeat_details
    done = float(details[0]) if details else 0.0
    # Beating slower than the heartbeat timeout would have the server give the wait away while it runs.
    every = min(inp.heartbeat_every, info.heartbeat_timeout.total_seconds() / 3) if info.heartbeat_timeout else inp.heartbeat_every
    while done < inp.seconds:
        step = min(every, inp.seconds - done)
        await asyncio.sleep(step)
        done += step
        activity.heartbeat(done)
    return WaitOutput(waited_seconds=done)


def _journal_path(explicit: str | None) -> Path:
    return Path(explicit or os.environ.get("COLDSTART_JOURNAL", ".state/journal.jsonl"))


@implements(NOTE)
def note(inp: NoteInput) -> NoteOutput:
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


@implements(HTTP_CHECK)
async def http_check(inp: HttpCheckInput) -> HttpCheckOutput:
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


@implements(PROMETHEUS_QUERY)
async def prometheus_query(inp: PrometheusQueryInput) -> PrometheusQueryOutput:
    try:
        async with beating():
            data = await instant_query(inp.endpoint, inp.query, timeout=inp.timeout_seconds)
        value = single_value(data)
    except PrometheusError as exc:
        raise ApplicationError(str(exc)) from None
    series = data["result"] if data.get("resultType") == "vector" else []
    return PrometheusQueryOutput(value=value, series=series)
