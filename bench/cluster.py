"""The production topology's cost: per-step overhead on the PostgreSQL cluster vs the dev server, and runs a minute one worker sustains.

Per-step time is measured as in step_overhead.py (gaps between activity completions in a run's
history, server timestamps) for N do-nothing steps through the interpreter, on both servers in one
run. Throughput: the real worker (worker.py, its own process, default limits) on the cluster,
while this process keeps --in-flight runs of a 3-step runbook going on distinct targets for
--seconds; completed runs are counted. Needs root (the cluster's PostgreSQL runs as postgres).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _targets import development_target
from step_overhead import _gaps, _p99
from temporalio.testing import WorkflowEnvironment

from activities.catalog import load_registry
from lab.drills.harness import WorkerProcess
from runtime.cluster import Cluster
from runtime.connection import DATA_CONVERTER
from runtime.runs import start_run
from runtime.server_config import dynamic_config_flags
from runtime.worker import build_worker
from workflows import search
from workflows.loader import plan_run


def _book(work: Path, name: str, steps: int) -> Path:
    path = work / f"{name}.yaml"
    body = "\n".join(f"  - id: s{i}\n    action: core.wait\n    with: {{seconds: 0}}" for i in range(steps))
    path.write_text(f"metadata: {{name: {name}}}\ntarget: bench\nsteps:\n{body}\n")
    return path


async def _per_step(client, book: Path, queue: str) -> tuple[list[float], float]:
    registry = load_registry()
    async with build_worker(client, queue, registry=registry, allow_development=True):
        run = plan_run(book, registry=registry, inventory=development_target(f"overhead-{queue}"), initiator="bench")
        started = time.monotonic()
        handle = await start_run(client, run, queue)
        await handle.result()
        return _gaps(await handle.fetch_history()), time.monotonic() - started


async def _throughput(cluster: Cluster, book: Path, work: Path, seconds: float, in_flight: int) -> dict[str, float]:
    client = await cluster.client()
    registry = load_registry()
    worker = WorkerProcess(cluster.address, "bench-throughput", work / "actions.jsonl", work / "worker.log", {},
                           allow_development=True)
    await asyncio.to_thread(worker.start)
    latencies: list[float] = []
    counter = iter(range(10**9))
    deadline = time.monotonic() + seconds

    async def one_after_another() -> None:
        while time.monotonic() < deadline:
            run = plan_run(book, registry=registry, inventory=development_target(f"bench-{next(counter)}"), initiator="bench")
            started = time.monotonic()
            handle = await start_run(client, run, "bench-throughput")
            await handle.result()
            if time.monotonic() <= deadline:
                latencies.append(time.monotonic() - started)

    try:
        began = time.monotonic()
        await asyncio.gather(*(one_after_another() for _ in range(in_flight)))
        elapsed = min(time.monotonic(), deadline) - began
    finally:
        await asyncio.to_thread(worker.stop)
    ordered = sorted(latencies)
    return {"runs": len(ordered), "per_minute": len(ordered) / elapsed * 60, "p50": statistics.median(ordered),
            "p95": ordered[max(0, int(len(ordered) * 0.95) - 1)]}


async def main(steps: int, seconds: float, in_flight: int) -> None:
    # The cluster's database is a few hundred MB after a run: removed with the rest.
    with tempfile.TemporaryDirectory(prefix="coldstart-bench-cluster-") as tmp:
        await _measure(Path(tmp), steps, seconds, in_flight)


async def _measure(work: Path, steps: int, seconds: float, in_flight: int) -> None:
    overhead_book, short_book = _book(work, "overhead", steps), _book(work, "three-steps", 3)
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.prefix) / "bin" / "temporal"),
        data_converter=DATA_CONVERTER, search_attributes=search.ALL, dev_server_log_level="error",
        dev_server_extra_args=dynamic_config_flags(),  # what `coldstart server` runs
    )
    try:
        dev, dev_wall = await _per_step(env.client, overhead_book, "bench-dev")
    finally:
        await env.shutdown()
    started = time.monotonic()
    async with Cluster(work / "cluster") as cluster:
        up = time.monotonic() - started
        on_cluster, cluster_wall = await _per_step(await cluster.client(), overhead_book, "bench-cluster")
        rate = await _throughput(cluster, short_book, work, seconds, in_flight)
    print(f"steps: {steps} sequential do-nothing steps (core.wait 0 s) through the interpreter")
    for name, gaps, wall in (("dev server (in-memory SQLite)", dev, dev_wall),
                             ("cluster (PostgreSQL)", on_cluster, cluster_wall)):
        print(f"{name:30} median {statistics.median(gaps):6.2f} ms/step, p99 {_p99(gaps):6.2f} ms/step, wall {wall:.2f} s")
    print(f"cluster / dev (median): {statistics.median(on_cluster) / statistics.median(dev):.2f}x; cluster up in {up:.1f} s")
    print(f"throughput: one worker, {in_flight} runs in flight, 3-step runbook on distinct targets, {seconds:.0f} s: "
          f"{rate['runs']:.0f} runs, {rate['per_minute']:.0f} runs/min, run latency p50 {rate['p50'] * 1000:.0f} ms, "
          f"p95 {rate['p95'] * 1000:.0f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--in-flight", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.seconds, args.in_flight))
