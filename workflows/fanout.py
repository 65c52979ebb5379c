"""for_each fan-outs: bounded concurrency and a failure threshold, in batches of child workflows when large."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.failure_bounds import bounded
    from workflows.calls import StepFailed, execute_action
    from workflows.contract import FanOutInput, FanOutResult, SealedFanOut, parsed_start
    from workflows.history_tags import ActivityTag
    from workflows.refs import RefError, resolve
    from workflows.sealing import fan_out_place, start_refusal, verify
    from workflows.spec import ForEachSpec

__all__ = [
    "BATCH_ITEMS",
    "FAILURES_KEPT",
    "FANOUT_CHILD_THRESHOLD",
    "RESULTS_BUDGET",
    "RESUME_BUDGET",
    "FanOutWorkflow",
    "reads_results",
    "run_fan_out",
    "run_in_batches",
    "shown_outputs",
]

# Fan-outs larger than this run in child workflows, so the parent's history stays small.
FANOUT_CHILD_THRESHOLD = 100
# The most items one child runs: about 4 events each, so its history stays near 2,000 events.
BATCH_ITEMS = 500
# Per-item outputs one child hands back, and the items one child is given, in bytes of JSON (Temporal warns
# at 512 KiB a payload).
RESULTS_BUDGET = 256 * 1024
# The most a continued run's input may carry (Temporal warns at 512 KiB a payload).
RESUME_BUDGET = 448 * 1024
FAILURES_KEPT = 50
FAILURE_CHARS = 500
# A batch's first size when its results are kept and no batch has yet shown how large they are.
_FIRST_KEPT_BATCH = 50


def _size(value: Any) -> int:
    return len(json.dumps(value, default=str, separators=(",", ":")))


def _ranges(indices: list[int]) -> list[list[int]]:
    """Sorted indices as [first, last] pairs: 0-499 and 501-999 succeeded is two pairs, not 999 numbers."""
    out: list[list[int]] = []
    for index in sorted(indices):
        if out and out[-1][1] == index - 1:
            out[-1][1] = index
        else:
            out.append([index, index])
    return out


async def run_fan_out(inp: FanOutInput) -> FanOutResult:
    """Run one action per item with bounded concurrency; stop launching once the threshold is exceeded."""
    spec: ForEachSpec = inp.spec
    allowed = spec.allowed_failures(len(inp.items)) if inp.allowed is None else inp.allowed
    limiter = asyncio.Semaphore(inp.concurrency or spec.max_concurrency)
    results: list[Any] = [None] * len(inp.items)
    failures: list[str] = []
    succeeded: list[int] = []
    failed = 0

    async def one(position: int, item: Any) -> None:
        nonlocal failed
        index = inp.offset + position
        async with limiter:
            if failed > allowed:
                return
            try:
                args = resolve(spec.with_, {**inp.context, spec.as_: item})
                results[position] = await execute_action(
                    inp.action,
                    args,
                    activity_id=f"{inp.step_id}[{index}]#{inp.attempt}",
                    summary=f"{inp.step_id} [{index}]: {inp.action.name} {json.dumps(item, default=str)[:120]}",
                    tag=ActivityTag("fan-out", inp.step_id, item=index),
                    timeout=spec.timeout,
                )
                succeeded.append(index)
            except (StepFailed, RefError) as exc:
                failed += 1
                if len(failures) < FAILURES_KEPT:
                    failures.append(bounded(f"[{index}] {json.dumps(item, default=str)[:80]}: {exc}", FAILURE_CHARS))

    await asyncio.gather(*(one(i, item) for i, item in enumerate(inp.items)))
    return FanOutResult(
        total=len(inp.items),
        succeeded=len(succeeded),
        failed=failed,
        failures=failures,
        results=results if inp.keep_results else None,
        done=_ranges(succeeded),
    )


def reads_results(steps: Sequence[BaseModel], step_id: str) -> bool:
    """Whether a step refers to `step_id`'s per-item results (anything of its outputs but the counts)."""
    pattern = re.compile(rf"steps\.{re.escape(step_id)}\.outputs(?!\.(?:total|succeeded|failed|failures|done)\b)")
    return any(pattern.search(step.model_dump_json(by_alias=True)) for step in steps)


def shown_outputs(outputs: dict[str, Any]) -> dict[str, Any]:
    """A fan-out's outputs as its status shows them: per-item results over RESULTS_BUDGET are counted, not listed
    (later steps still read them whole)."""
    results = outputs.get("results")
    if results is None or _size(results) <= RESULTS_BUDGET:
        return outputs
    return {**{k: v for k, v in outputs.items() if k != "results"},
            "results_kept": f"{len(results)} items' outputs, kept for later steps and not shown"}


StartBatch = Callable[[FanOutInput, int], Awaitable[FanOutResult]]


async def run_in_batches(inp: FanOutInput, start: StartBatch) -> FanOutResult:
    """Run the items in batches, each by `start(batch input, batch number)` (a child workflow), two at a time
    sharing the step's concurrency, and merge their summaries. A batch's items stay within RESULTS_BUDGET; per-item
    results are gathered only when `inp.keep_results`, and each batch then holds as many items as keep its
    results within the budget too, judged from the batches before it."""
    spec = inp.spec
    total = len(inp.items)
    allowed = spec.allowed_failures(total)
    lanes = min(2, spec.max_concurrency)
    merged = FanOutResult(total=total, succeeded=0, failed=0, results=[None] * total if inp.keep_results else None)
    sizes = [_size(item) + 1 for item in inp.items]
    seen = {"items": 0, "bytes": 0}
    cut: list[str] = []
    state = {"next": 0, "batch": 0, "stopped": 0}

    def batch_size() -> int:
        if not inp.keep_results:
            return BATCH_ITEMS
        if not seen["items"]:
            return _FIRST_KEPT_BATCH
        per_item = max(1, seen["bytes"] // seen["items"])
        return max(1, min(BATCH_ITEMS, RESULTS_BUDGET // 2 // per_item))

    async def lane() -> None:
        while state["next"] < total and merged.failed <= allowed and not state["stopped"]:
            first = state["next"]
            end, held = first, 0
            # The batch's items are its input payload: cut it at the budget too (one item at least).
            while end < total and end - first < batch_size() and (end == first or held + sizes[end] <= RESULTS_BUDGET):
                held += sizes[end]
                end += 1
            items = inp.items[first:end]
            state["next"] = first + len(items)
            state["batch"] += 1
            batch = inp.model_copy(update={
                "items": items, "offset": inp.offset + first, "allowed": allowed - merged.failed,
                "concurrency": max(1, spec.max_concurrency // lanes),
            })
            try:
                result = await start(batch, state["batch"])
            except BaseException:
                state["stopped"] = 1  # the step has failed: the other lane launches no further batch
                raise
            merged.succeeded += result.succeeded
            merged.failed += result.failed
            merged.failures = (merged.failures + result.failures)[:FAILURES_KEPT]
            merged.done = _ranges([i for a, b in merged.done + result.done for i in range(a, b + 1)])
            if merged.results is not None:
                if result.results is None:
                    cut.append(f"{inp.offset + first}-{inp.offset + first + len(items) - 1}")
                else:
                    merged.results[first:first + len(items)] = result.results
                    seen["items"] += len(items)
                    seen["bytes"] += _size(result.results)

    await asyncio.gather(*(lane() for _ in range(lanes)))
    if cut:
        merged.results = None
        merged.results_missing = (f"the per-item outputs of items {', '.join(cut[:5])} were over {RESULTS_BUDGET // 1024} KiB "
                                  "a batch and were not kept")
    return merged


# Unsandboxed: re-importing the interpreter's modules into a sandbox on every activation was a seventh of a
# 1,000-item fan-out's worker CPU. The code is the deterministic interpreter's own (no I/O, no clock but the
# workflow's), and the replay tests hold it to that.
@workflow.defn(sandboxed=False)
class FanOutWorkflow:
    """A batch of a large for_each fan-out, as a child so its activity events stay out of the parent's history.

    Only a run of this controller starts one: it runs the batch its parent sealed for its id, or nothing."""

    @workflow.run
    async def run(self, start: SealedFanOut | dict[str, Any]) -> FanOutResult:
        sealed, refused = parsed_start(SealedFanOut, start)
        if sealed is not None:
            refused = await _refusal(sealed)
        if refused is not None or sealed is None:
            raise ApplicationError(f"fan-out refused by the controller: {refused}", type="FanOutRefused",
                                   non_retryable=True)
        result = await run_fan_out(sealed.batch)
        # The result is one payload: per-item outputs past the budget are dropped, and the parent says so.
        if result.results is not None and _size(result.results) > RESULTS_BUDGET:
            result.results = None
        return result


async def _refusal(sealed: SealedFanOut) -> str | None:
    """Why this batch may not run here, or None: it must come from its parent run, sealed for this child."""
    info = workflow.info()
    refusal = start_refusal("fan-out batch")
    if refusal is not None:
        return refusal
    if info.parent is None:
        return "a fan-out batch runs only as the child of the run whose step it is, never started by a client"
    return await verify(sealed.batch, sealed.seal,
                        fan_out_place(info.workflow_id, info.parent.workflow_id, info.parent.run_id))
