"""Runs readiness checks concurrently, each within its own timeout; a check that cannot decide says unknown and why."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from activities.retry import format_duration
from runtime.readiness.model import Check, Report, Result, unknown

__all__ = ["run_checks"]


async def _one(check: Check) -> Result:
    started = time.monotonic()
    try:
        verdict = await asyncio.wait_for(check.probe(), check.timeout)
    except TimeoutError:
        verdict = unknown(f"no answer within {format_duration(check.timeout)}")
    except Exception as exc:  # noqa: BLE001 - a probe's own failure is an unknown, never a crash of the others
        verdict = unknown(f"the check failed: {type(exc).__name__}: {_first_line(exc)}")
    return Result(check.name, check.kind, verdict.state, verdict.evidence, time.monotonic() - started)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"


async def run_checks(runbook: str, target: str, checks: Iterable[Check]) -> Report:
    """Every check at once; the report keeps their order."""
    checked_at = time.time()
    results = await asyncio.gather(*(_one(check) for check in checks))
    return Report(runbook, target, checked_at, list(results))


