"""Per-step overhead of the interpreter: 200 do-nothing steps vs 200 bare activities, on the local dev server.

Like against like: both workflows run on workers with the same runner (unsandboxed, as production
runs the interpreter), the same activity executor and the same limits; the two sides alternate which
goes first, over several rounds (`--rounds N`, 5 by default). Prints the median and p99 per-step
time of each side in every round, then the median over rounds and the spread (min-max) of the round
medians. A side bare+options schedules each activity with what the interpreter asks of the server beside
it (the action's heartbeat timeout, a summary for the timeline). A side bare+memo sets, once before its steps,
a memo of the size and key count the interpreter's run ends with (the server keeps the memo in the run's
mutable state and handles it again with every transaction of the run). A side bare+visible upserts on every step what the
interpreter keeps for operators (the current-step search attribute and a memo entry), as the interpreter
does; the bench counts each side's upserts, timers and workflow tasks. Goal: interpreter median <= 1.2x the bare activity. Per-step time is
the gap between consecutive activity completions in each run's history (server timestamps), so
client start-up is not counted; a table splits it into phases (the activity waiting for a worker, on the
worker, the next workflow task waiting for a worker, on the worker and back).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _targets import development_target
from bare_workflow import BareActivities
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from runtime.connection import DATA_CONVERTER
from runtime.runs import start_run
from runtime.server_config import dynamic_config_flags
from runtime.worker import UNSANDBOXED_RUNNER, build_worker
from workflows import search
from workflows.loader import plan_run

STEPS = 200


def _gaps(history) -> list[float]:
    done = [e.event_time.ToDatetime() for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED]
    return [(b - a).total_seconds() * 1000 for a, b in itertools.pairwise(done)]


# A step's phases, from its history's server timestamps: the activity waiting for a worker, the activity
# on the worker (its interceptors, its conversions, the completion's round trip), the server handing the
# next workflow task to a worker, and that task on the worker and back (the interpreter's activation).
PHASES = {
    "activity dispatched": (EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED),
    "activity ran": (EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED),
    "workflow task dispatched": (EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED),
    "workflow task ran": (EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED, EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED),
}


def _phases(history) -> dict[str, float]:
    """Each phase's median in ms over the run's steps: the time from an event of the first type to the next
    event of the second type."""
    spans: dict[str, list[float]] = {name: [] for name in PHASES}
    last: dict[int, float] = {}
    for event in history.events:
        at = event.event_time.ToDatetime().timestamp() * 1000
        for name, (begin, end) in PHASES.items():
            if event.event_type == end and begin in last:
                spans[name].append(at - last.pop(begin))
        if any(event.event_type == begin for begin, _ in PHASES.values()):
            last[event.event_type] = at
    return {name: statistics.median(values) if values else math.nan for name, values in spans.items()}


_VIEW_EVENTS = {
    "memo upserts": EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED,
    "search attribute upserts": EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
    "timers": EventType.EVENT_TYPE_TIMER_STARTED,
    "workflow tasks": EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
}


def _memo_shape(history) -> tuple[int, int]:
    """A run's memo at its end, (bytes, keys): each key's last upserted payload, less the keys removed."""
    sizes: dict[str, int] = {}
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED:
            for key, payload in e.workflow_properties_modified_event_attributes.upserted_memo.fields.items():
                sizes[key] = len(payload.data)
                if not payload.data or payload.metadata.get("encoding") == b"binary/null":
                    del sizes[key]
    return sum(sizes.values()), len(sizes)


def _view_counts(history) -> dict[str, int]:
    return {name: sum(e.event_type == kind for e in history.events) for name, kind in _VIEW_EVENTS.items()}


def _p99(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.99) - 1)]


async def _interpreter(env, registry, book: Path, round_no: int):
    run = plan_run(book, registry=registry, inventory=development_target(f"bench-{round_no}"), initiator="bench")
    handle = await start_run(env.client, run, "bench")
    await handle.result()
    return await handle.fetch_history()


async def _bare(env, round_no: int, side: str, memo: tuple[int, int]):
    args = [STEPS, side == "bare+visible", side == "bare+options", *(memo if side == "bare+memo" else (0, 0))]
    handle = await env.client.start_workflow(BareActivities.run, args=args,
                                             id=f"{side}-{round_no}", task_queue="bench-bare")
    await handle.result()
    return await handle.fetch_history()


async def main(rounds: int) -> None:
    from temporalio.worker import Worker

    from activities.catalog import load_registry

    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.prefix) / "bin" / "temporal"),
        data_converter=DATA_CONVERTER, search_attributes=search.ALL, dev_server_log_level="error",
        dev_server_extra_args=dynamic_config_flags(),  # what `coldstart server` runs
    )
    work = Path(tempfile.mkdtemp())
    book = work / "overhead.yaml"
    steps = "\n".join(f"  - id: s{i}\n    action: core.wait\n    with: {{seconds: 0}}" for i in range(STEPS))
    book.write_text(f"metadata: {{name: overhead}}\ntarget: bench\nsteps:\n{steps}\n")
    medians: dict[str, list[float]] = {"interpreter": [], "bare": [], "bare+options": [], "bare+memo": [], "bare+visible": []}
    memo = (35_000, 11)  # the interpreter's memo at its end, bytes and keys (about a 200-step run's until it has run once)
    phases: dict[str, list[dict[str, float]]] = {side: [] for side in medians}
    counts: dict[str, list[dict[str, int]]] = {side: [] for side in medians}
    try:
        registry = load_registry()
        # The same runner, executor size and activity limit as build_worker gives the interpreter.
        async with build_worker(env.client, "bench", registry=registry, max_concurrent_activities=100,
                                allow_development=True), Worker(
            env.client, task_queue="bench-bare", workflows=[BareActivities], activities=registry.activities(),
            activity_executor=ThreadPoolExecutor(100), max_concurrent_activities=100,
            workflow_runner=UNSANDBOXED_RUNNER,
        ):
            for r in range(rounds):
                order = list(medians)
                order = order[r % len(order):] + order[:r % len(order)]  # each side goes first in turn
                for side in order:
                    started = time.monotonic()
                    history = await (_interpreter(env, registry, book, r) if side == "interpreter"
                                     else _bare(env, r, side, memo))
                    if side == "interpreter":
                        memo = _memo_shape(history)
                    wall = time.monotonic() - started
                    gaps = _gaps(history)
                    phases[side].append(_phases(history))
                    counts[side].append(_view_counts(history))
                    medians[side].append(statistics.median(gaps))
                    print(f"round {r + 1} {side:12s}: median {medians[side][-1]:6.2f} ms/step, "
                          f"p99 {_p99(gaps):6.2f} ms/step, wall {wall:5.2f} s"
                          f"{' (first)' if side == order[0] else ''}", flush=True)
    finally:
        await env.shutdown()
    im, bm = statistics.median(medians["interpreter"]), statistics.median(medians["bare"])
    vm, om = statistics.median(medians["bare+visible"]), statistics.median(medians["bare+options"])
    mm = statistics.median(medians["bare+memo"])
    print(f"steps: {STEPS} sequential do-nothing steps (core.wait 0 s) a run, {rounds} rounds alternating which "
          "side goes first, both unsandboxed on the local dev server")
    for side, values in medians.items():
        print(f"{side}: median of round medians {statistics.median(values):.2f} ms/step, "
              f"spread {min(values):.2f}-{max(values):.2f}")
    print("where a step goes, by phase (ms, median over rounds of each run's median; server timestamps):")
    print(f"  {'phase':26s}" + "".join(f"{side:>14s}" for side in phases))
    for name in PHASES:
        print(f"  {name:26s}" + "".join(f"{statistics.median(p[name] for p in per_round):14.2f}"
                                        for per_round in phases.values()))
    print(f"events of a {STEPS}-step run (median over rounds):")
    print(f"  {'event':26s}" + "".join(f"{side:>14s}" for side in counts))
    for name in _VIEW_EVENTS:
        print(f"  {name:26s}" + "".join(f"{statistics.median(c[name] for c in per_round):14.0f}"
                                        for per_round in counts.values()))
    print(f"breakdown of a step (medians): bare activity {bm:.2f} ms; the interpreter's activity options "
          f"(heartbeat timeout, summary) {om - bm:+.2f} ms (bare+options); the view upserted on every step "
          f"{vm - bm:+.2f} ms (bare+visible); a memo of the interpreter's size ({memo[0] / 1024:.0f} KiB, {memo[1]} keys) set once "
          f"{mm - bm:+.2f} ms (bare+memo); the interpreter, its view included, {im - bm:+.2f} ms "
          f"({im - mm:+.2f} ms beyond a bare activity carrying its memo)")
    print(f"ratio (median): {im / bm:.2f}x of a bare activity, {im / om:.2f}x of one with the same options, "
          f"{im / mm:.2f}x of one carrying the same memo "
          f"({im / vm:.2f}x of one upserting the view every step)  "
          f"goal: <= 1.2x of a bare activity -> {'met' if im / bm <= 1.2 else 'NOT met'}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args().rounds))
