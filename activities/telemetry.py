"""Gate readings: one sample of a health signal, from Prometheus or an HTTP probe."""

from __future__ import annotations

import time
from typing import Literal

import httpx
from pydantic import BaseModel

from activities._http import reading_client
from activities.prometheus import PrometheusError, instant_query, single_value
from activities.registry import action
from activities.retry import Retry

__all__ = ["ReadInput", "Reading", "read"]


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


@action("telemetry.read", timeout=30, retry=Retry(max_attempts=1))
async def read(inp: ReadInput) -> Reading:
    """Read one gate sample; an unreachable source or an empty result is an error, so the gate fails closed."""
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
