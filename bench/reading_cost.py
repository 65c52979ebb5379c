"""What a gate reading costs the Temporal server and the worker, beside what a do-nothing step costs.

On the local dev server with the real worker (bench/shedding.py's, in its own process): 50 runs of one
gate each (as the spread flood), at their gates, with readings held (a pace of one per 1,000 s: what
50 runs waiting at their gates cost with nothing read), at 1 a second (the worker's pace while it
runs steps, a tenth of 10) and at 10 a second (its full pace). Then one run of do-nothing steps.
Each phase is paired with the same seconds measured on the idle server right before it, after a
settling wait (after a phase the server keeps working for a while: 0.006 to 0.155 s a second with
nothing running), and is given as CPU seconds a second of the server and the worker beyond that
quiet, with the milliseconds of server and worker CPU one reading (or one step) costs. Never asserts.

    .venv/bin/python bench/reading_cost.py [--repeats=3] [--seconds=15]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import shedding
from _targets import development_target
from temporalio.testing import WorkflowEnvironment

from runtime.worker import READINGS_PER_SECOND_ENV

RUNS, STEPS = 50, 300
SETTLE = 20.0  # seconds for the server to finish a phase's tail before the quiet is measured
PHASES = {"held": "0.001", "1 a second": "1", "10 a second": "10"}


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


async def _quiet(seconds: float) -> float:
    """The idle server's CPU seconds a second, once the last phase's tail has passed."""
    await asyncio.sleep(SETTLE)
    server = _server()
    before, began = _cpu(server), time.monotonic()
    await asyncio.sleep(seconds)
    return (_cpu(server) - before) / (time.monotonic() - began)


async def _phase(env, address: str, queue: str, per_second: str, lone: Path, prom, seconds: float) -> tuple[float, float, float]:
    """Server CPU seconds a second beyond the quiet before, the worker's, and readings a second, with
    RUNS runs at their gates."""
    quiet = await _quiet(seconds)
    async with shedding._worker(address, queue, settings={READINGS_PER_SECOND_ENV: per_second}) as worker:
        registry = shedding.load_registry()
        handles = [await shedding.start_run(env.client, shedding.plan_run(
            lone, registry=registry, inventory=development_target(f"{queue}-{i}"), initiator="bench"), queue) for i in range(RUNS)]
        await shedding._at_their_gates(handles)
        await asyncio.sleep(5)  # the starts' own work done
        server, worker_process = _server(), psutil.Process(worker.pid)
        server_before, worker_before, calls_before, began = _cpu(server), _cpu(worker_process), len(prom.calls), time.monotonic()
        await asyncio.sleep(seconds)
        elapsed = time.monotonic() - began
        figures = ((_cpu(server) - server_before) / elapsed - quiet, (_cpu(worker_process) - worker_before) / elapsed,
                   (len(prom.calls) - calls_before) / elapsed)
        for handle in handles:
            await handle.terminate("bench over")
    return figures


async def _steps(env, address: str, queue: str, book: Path) -> tuple[float, float, float]:
    """Server CPU seconds a second beyond the quiet before, the worker's, and steps a second, during one
    run of STEPS do-nothing steps."""
    quiet = await _quiet(5)
    async with shedding._worker(address, queue) as worker:
        run = shedding.plan_run(book, registry=shedding.load_registry(), inventory=development_target(queue), initiator="bench")
        warm = await shedding.start_run(env.client, run, queue)  # the worker's first run pays its imports
        await warm.result()
        server, worker_process = _server(), psutil.Process(worker.pid)
        run = shedding.plan_run(book, registry=shedding.load_registry(), inventory=development_target(f"{queue}-measured"), initiator="bench")
        server_before, worker_before, began = _cpu(server), _cpu(worker_process), time.monotonic()
        handle = await shedding.start_run(env.client, run, queue)
        await handle.result()
        elapsed = time.monotonic() - began
        return ((_cpu(server) - server_before) / elapsed - quiet, (_cpu(worker_process) - worker_before) / elapsed,
                STEPS / elapsed)


def _server() -> psutil.Process:
    server = shedding.dev_server()
    assert server is not None, "no dev server started"
    return server


async def main(repeats: int, seconds: float) -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.prefix) / "bin" / "temporal"),
        data_converter=shedding.DATA_CONVERTER, search_attributes=shedding.search.ALL, dev_server_log_level="error",
        dev_server_extra_args=shedding.dynamic_config_flags(),
    )
    address = env.client.service_client.config.target_host
    prom = await shedding.support.ScriptedPrometheus().start()
    work = Path(tempfile.mkdtemp())
    lone, book = shedding.lone_gate_book(work, prom.url), shedding.steps_book(work, STEPS)
    figures: dict[str, list[tuple[float, float, float]]] = {}
    try:
        for r in range(repeats):
            for name, per_second in PHASES.items():
                figures.setdefault(name, []).append(
                    await _phase(env, address, f"cost{r}-{per_second}", per_second, lone, prom, seconds))
            figures.setdefault("steps", []).append(await _steps(env, address, f"steps{r}", book))
    finally:
        await prom.stop()
        await env.shutdown()
    print(f"{repeats} repeats, {seconds:.0f} s a phase, {RUNS} runs of one gate at their gates (steps: one run of {STEPS}), "
          f"{os.cpu_count()} cores; medians over the repeats (min to max)")
    print(f"{'phase':<14} {'server s/s':>20} {'worker s/s':>20} {'events/s':>9} {'server ms each':>15} {'worker ms each':>15}")
    for name, rows in figures.items():
        server, worker, rate = (statistics.median(column) for column in zip(*rows, strict=True))
        spread = [f"{min(column):.3f} to {max(column):.3f}" for column in list(zip(*rows, strict=True))[:2]]
        # All a phase spent beyond the quiet, a reading or step at a time (the held phase shows what
        # 50 runs waiting at their gates cost with nothing read).
        each = "" if rate < 0.5 else f"{server / rate * 1000:15.1f} {worker / rate * 1000:15.1f}"
        print(f"{name:<14} {server:6.3f} ({spread[0]:>13}) {worker:6.3f} ({spread[1]:>13}) {rate:9.2f} {each}")


if __name__ == "__main__":
    REPEATS = next((int(arg[10:]) for arg in sys.argv[1:] if arg.startswith("--repeats=")), 3)
    SECONDS = next((float(arg[10:]) for arg in sys.argv[1:] if arg.startswith("--seconds=")), 15.0)
    asyncio.run(main(REPEATS, SECONDS))
    sys.stdout.flush()
    os._exit(0)  # as bench/shedding.py: Temporal's native threads can abort the interpreter's finalization
