"""for_each fan-outs: bounded concurrency and a failure threshold, in a child workflow when large."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.calls import StepFailed, execute_action
    from workflows.contract import FanOutInput, FanOutResult
    from workflows.history_tags import ActivityTag
    from workflows.refs import RefError, resolve
    from workflows.spec import ForEachSpec

__all__ = ["FANOUT_CHILD_THRESHOLD", "FanOutWorkflow", "run_fan_out"]

# Fan-outs larger than this run in a child workflow, so the parent's history stays small.
FANOUT_CHILD_THRESHOLD = 100


async def run_fan_out(inp: FanOutInput) -> FanOutResult:
    """Run one action per item with bounded concurrency; stop launching once the threshold is exceeded."""
    spec: ForEachSpec = inp.spec
    allowed = spec.allowed_failures(len(inp.items))
    limiter = asyncio.Semaphore(spec.max_concurrency)
    results: list[Any] = [None] * len(inp.items)
    failures: list[str] = []
    done = 0

    async def one(index: int, item: Any) -> None:
        nonlocal done
        async with limiter:
            if len(failures) > allowed:
                return
            try:
                args = resolve(spec.with_, {**inp.context, spec.as_: item})
                results[index] = await execute_action(
                    inp.action,
                    args,
                    activity_id=f"{inp.step_id}[{index}]#{inp.attempt}",
                    summary=f"{inp.step_id} [{index}]: {inp.action.name} {json.dumps(item, default=str)[:120]}",
                    tag=ActivityTag("fan-out", inp.step_id, item=index),
                    timeout=spec.timeout,
                )
                done += 1
            except (StepFailed, RefError) as exc:
                failures.append(f"[{index}] {json.dumps(item, default=str)[:80]}: {exc}")

    await asyncio.gather(*(one(i, item) for i, item in enumerate(inp.items)))
    return FanOutResult(
        total=len(inp.items),
        succeeded=done,
        failed=len(failures),
        failures=failures[:50],
        results=results,
    )


# Unsandboxed: re-importing the interpreter's modules into a sandbox on every activation was a seventh of a
# 1,000-item fan-out's worker CPU. The code is the deterministic interpreter's own (no I/O, no clock but the
# workflow's), and the replay tests hold it to that.
@workflow.defn(sandboxed=False)
class FanOutWorkflow:
    """A large for_each fan-out, as a child so its activity events stay out of the parent's history."""

    @workflow.run
    async def run(self, inp: FanOutInput) -> FanOutResult:
        return await run_fan_out(inp)
