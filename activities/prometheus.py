"""The one Prometheus HTTP API client: instant and range queries, and a result reduced to one number, failing closed."""

from __future__ import annotations

import math
from typing import Any

import httpx

from activities._http import async_client
from activities.errors import Unavailable

__all__ = ["PrometheusError", "instant_query", "range_query", "single_value"]


class PrometheusError(Unavailable):
    """The query could not produce exactly one number."""


async def instant_query(base_url: str, query: str, *, timeout: float = 10.0, client: httpx.AsyncClient | None = None) -> dict:
    """GET /api/v1/query and return its `data` (resultType and result)."""
    return await _api(base_url, "query", {"query": query}, timeout=timeout, client=client)


async def range_query(base_url: str, query: str, *, start: float, end: float, step: str = "2s",
                      timeout: float = 10.0, client: httpx.AsyncClient | None = None) -> dict:
    """GET /api/v1/query_range and return its `data` (a matrix: each series' [time, value] pairs)."""
    params = {"query": query, "start": start, "end": end, "step": step}
    return await _api(base_url, "query_range", params, timeout=timeout, client=client)


async def _api(base_url: str, endpoint: str, params: dict, *, timeout: float, client: httpx.AsyncClient | None) -> dict:
    url = base_url.rstrip("/") + "/api/v1/" + endpoint
    owned = client is None
    client = client or async_client(timeout)
    try:
        response = await client.get(url, params=params, timeout=timeout)
    except httpx.HTTPError as exc:
        raise PrometheusError(f"prometheus at {base_url} unreachable: {type(exc).__name__}: {exc}") from None
    finally:
        if owned:
            await client.aclose()
    try:
        body = response.json()
    except ValueError:
        raise PrometheusError(f"prometheus answered {response.status_code} with non-JSON") from None
    if body.get("status") != "success":
        raise PrometheusError(f"prometheus rejected the query: {body.get('errorType', '')} {body.get('error', response.status_code)}".strip())
    return body["data"]


def single_value(data: dict) -> float:
    """Reduce a query result to one number; empty or ambiguous results are errors, never a pass."""
    kind = data.get("resultType")
    result: Any = data.get("result")  # JSON: a [time, value] pair or a list of series, as resultType says
    if kind == "scalar":
        value = float(result[1])
    elif kind == "vector":
        if not result:
            raise PrometheusError("empty result (no series matched)")
        if len(result) > 1:
            raise PrometheusError(f"{len(result)} series returned; aggregate the query (e.g. max(...)) to one")
        value = float(result[0]["value"][1])
    else:
        raise PrometheusError(f"unsupported result type {kind!r}; use an instant vector or scalar")
    if math.isnan(value):
        raise PrometheusError("the value is NaN")
    return value
