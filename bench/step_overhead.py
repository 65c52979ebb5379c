"""Per-step overhead of the interpreter: 200 do-nothing steps vs 200 bare activities, on the local dev server.

Prints median and p99 per-step time for both. Goal: interpreter median <= 10 ms a step and
<= 1.5x the bare activity. Per-step time is the gap between consecutive activity completions
in each run's history (server timestamps), so client start-up is not counted.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment


from bare_workflow import BareActivities
from cli.runs import start_run
from runtime.connection import DATA_CONVERTER
from runtime.server_config import dynamic_config_flags
from runtime.worker import build_worker
from workflows import search
from workflows.loader import plan_run
from _targets import development_target  # noqa: E402

STEPS = 200


def _gaps(history) -> list[float]:
    done = [e.event_time.ToDatetime() for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED]
    return [(b - a).total_seconds() * 1000 for a, b in zip(done, done[1:])]


def _p99(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.99) - 1)]


async def main() -> None:
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
    try:
        registry = load_registry()
        async with build_worker(env.client, "bench", registry=registry), Worker(
            env.client, task_queue="bench-bare", workflows=[BareActivities], activities=registry.activities(),
            activity_executor=ThreadPoolExecutor(8),
        ):
            run = plan_run(book, registry=registry, inventory=development_target("bench"), initiator="bench")
            started = time.monotonic()
            handle = await start_run(env.client, run, "bench")
            await handle.result()
            interpreter_wall = time.monotonic() - started
            interpreter = _gaps(await handle.fetch_history())

            started = time.monotonic()
            bare_handle = await env.client.start_workflow(BareActivities.run, STEPS, id="bare", task_queue="bench-bare")
            await bare_handle.result()
            bare_wall = time.monotonic() - started
            bare = _gaps(await bare_handle.fetch_history())
    finally:
        await env.shutdown()
    im, bm = statistics.median(interpreter), statistics.median(bare)
    print(f"steps: {STEPS} sequential do-nothing steps (core.wait 0 s) on the local dev server")
    print(f"interpreter: median {im:.2f} ms/step, p99 {_p99(interpreter):.2f} ms/step, wall {interpreter_wall:.2f} s")
    print(f"bare activities: median {bm:.2f} ms/step, p99 {_p99(bare):.2f} ms/step, wall {bare_wall:.2f} s")
    print(f"ratio (median): {im / bm:.2f}x  goal: <= 10 ms and <= 1.5x -> "
          f"{'met' if im <= 10 and im / bm <= 1.5 else 'NOT met'}")


if __name__ == "__main__":
    asyncio.run(main())
