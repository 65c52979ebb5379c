"""Whether a drill may start on a target now: its blackout calendar and its blocking checks, read from Prometheus."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from activities.policy import DrillSafety
from activities.prometheus import PrometheusError, instant_query, single_value

__all__ = ["drill_refusal"]


def drill_refusal(safety: DrillSafety, inventory: dict[str, Any], *, now: datetime | None = None) -> str | None:
    """Why a drill may not start now (the first reason found), or None. A check that cannot be read refuses too:
    a drill does not start blind."""
    moment = now or datetime.now(UTC)
    blackout = safety.blackout_at(moment)
    if blackout is not None:
        return (f"inside the blackout {blackout.start.isoformat()} to {blackout.end.isoformat()}"
                + (f" ({blackout.reason})" if blackout.reason else ""))
    if not safety.blocking:
        return None
    prometheus = safety.prometheus or (inventory.get("telemetry") or {}).get("prometheus")
    if not prometheus:
        return "the target's drill checks need a Prometheus (policy.drills.prometheus or telemetry.prometheus)"
    return asyncio.run(_blocking(safety, prometheus))


async def _blocking(safety: DrillSafety, prometheus: str) -> str | None:
    for check in safety.blocking:
        try:
            red = single_value(await instant_query(prometheus, check.red_count(), timeout=10.0))
        except PrometheusError as exc:
            return f"blocking check {check.name} cannot be read: {exc}"
        if red > 0:
            return f"blocking check {check.name} is red ({red:g} series above 0: {check.query})"
    return None
