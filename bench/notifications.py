"""Steps keep their pace whatever the notification sinks do: per-step time with no notifier, and with three sinks
(one accepts, one refuses every event, one never answers), on the local dev server.

Each round runs RUNS runbooks of STEPS do-nothing steps under each condition (alternating which goes first);
every run sends its events (started, finished) to every sink. Per-step time is the gap between consecutive
activity completions in each run's history (server timestamps). Prints the median and p99 per condition and
what each sink delivered, gave up or dropped. Goal: the medians within 10 % of each other.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _targets import development_target
from aiohttp import web
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from runtime.connection import DATA_CONVERTER
from runtime.notifications import NOTIFICATIONS_DELIVERED, NOTIFICATIONS_DROPPED, Notifier, load_config
from runtime.runs import start_run
from runtime.server_config import dynamic_config_flags
from runtime.worker import build_worker
from workflows import search
from workflows.loader import plan_run
from workflows.notices import set_event_sink

STEPS = 20
RUNS = 10


async def _endpoint(mode: str) -> tuple[str, web.AppRunner, asyncio.Event]:
    hung = asyncio.Event()

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        if mode == "hang":
            await hung.wait()
        return web.Response(status=500 if mode == "refuse" else 200)

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", runner, hung  # type: ignore[union-attr]


def _gaps(history) -> list[float]:
    done = [e.event_time.ToDatetime() for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED]
    return [(b - a).total_seconds() * 1000 for a, b in itertools.pairwise(done)]


async def _round(env, registry, book: Path, queue: str, label: str) -> list[float]:
    gaps: list[float] = []
    for i in range(RUNS):
        run = plan_run(book, registry=registry, inventory=development_target(f"bench-{label}-{i}"), initiator="bench")
        handle = await start_run(env.client, run, queue)
        await handle.result()
        gaps += _gaps(await handle.fetch_history())
    return gaps


async def main(rounds: int) -> None:
    from activities.catalog import load_registry

    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.prefix) / "bin" / "temporal"),
        data_converter=DATA_CONVERTER, search_attributes=search.ALL, dev_server_log_level="error",
        dev_server_extra_args=dynamic_config_flags(),
    )
    endpoints = {mode: await _endpoint(mode) for mode in ("accept", "refuse", "hang")}
    work = Path(tempfile.mkdtemp())
    book = work / "paced.yaml"
    steps = "\n".join(f"  - id: s{i}\n    action: core.wait\n    with: {{seconds: 0}}" for i in range(STEPS))
    book.write_text(f"metadata: {{name: paced}}\ntarget: bench\nsteps:\n{steps}\n")
    os.environ["COLDSTART_BENCH_WEBHOOK_KEY"] = "bench"
    config = work / "notify.yaml"
    config.write_text(f"""sinks:
  - {{name: accepts, kind: webhook, url: "{endpoints['accept'][0]}", secret_env: COLDSTART_BENCH_WEBHOOK_KEY}}
  - {{name: refuses, kind: slack, url: "{endpoints['refuse'][0]}", attempts: 3}}
  - {{name: hangs, kind: alertmanager, url: "{endpoints['hang'][0]}", timeout: 60s, queue: 10}}
""")
    notifier = Notifier(load_config(config), link=lambda wid: f"http://ui/{wid}")
    per_step: dict[str, list[float]] = {"no notifier": [], "three sinks": []}
    registry = load_registry()
    try:
        async with build_worker(env.client, "bench", registry=registry, allow_development=True):
            for r in range(rounds):
                order = list(per_step) if r % 2 == 0 else list(reversed(per_step))
                for side in order:
                    set_event_sink(notifier.offer if side == "three sinks" else None)
                    started = time.monotonic()
                    gaps = await _round(env, registry, book, "bench", f"{r}-{side.replace(' ', '-')}")
                    per_step[side] += gaps
                    print(f"round {r + 1} {side:11s}: median {statistics.median(gaps):6.2f} ms/step, "
                          f"p99 {sorted(gaps)[int(len(gaps) * 0.99) - 1]:6.2f} ms/step, "
                          f"{RUNS} runs in {time.monotonic() - started:5.2f} s", flush=True)
    finally:
        set_event_sink(None)
        await asyncio.to_thread(notifier.close, 5.0)
        for _, runner, hung in endpoints.values():
            hung.set()
            await runner.cleanup()
        await env.shutdown()
    print(f"{rounds} rounds of {RUNS} runs x {STEPS} do-nothing steps per condition, alternating which goes first")
    medians = {}
    for side, gaps in per_step.items():
        medians[side] = statistics.median(gaps)
        print(f"{side}: median {medians[side]:.2f} ms/step, p99 {sorted(gaps)[int(len(gaps) * 0.99) - 1]:.2f} ms/step "
              f"over {len(gaps)} steps")
    for sink in ("accepts", "refuses", "hangs"):
        print(f"sink {sink}: delivered {NOTIFICATIONS_DELIVERED.value(sink)}, gave up "
              f"{NOTIFICATIONS_DROPPED.value(f'{sink}:gave_up')}, dropped (queue full) "
              f"{NOTIFICATIONS_DROPPED.value(f'{sink}:queue_full')}, left at stop {NOTIFICATIONS_DROPPED.value(f'{sink}:stopped')}")
    ratio = medians["three sinks"] / medians["no notifier"]
    print(f"ratio (median, three sinks / none): {ratio:.2f}x  goal: <= 1.10x -> {'met' if ratio <= 1.10 else 'NOT met'}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args().rounds))
