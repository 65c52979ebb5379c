"""CPU of a 200-step run's workflow activations, replayed from its history, and the status memo's upkeep share.

`--record PATH` first records the history on a local dev server (200 do-nothing steps, as
bench/step_overhead.py runs them); without it the bench reads PATH and starts no server, so the figures
are the worker's CPU only. It replays the history `--rounds` times with the SDK's Replayer on the
unsandboxed runner (as production runs the interpreter) and prints the median and spread of the
rounds' CPU seconds (process time), then one replay under cProfile: the share of its CPU in the
status memo's upkeep (the memo's keeper and the change watchers' conditions) and in status().
"""

from __future__ import annotations

import asyncio
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from runtime.connection import DATA_CONVERTER
from runtime.worker import UNSANDBOXED_RUNNER
from workflows.fanout import FanOutWorkflow
from workflows.runbook_workflow import RunbookWorkflow

STEPS = 200
WORKFLOW_ID = "coldstart-memo-upkeep"
# The upkeep: the keeper's own loop, and the conditions it and the notices watcher wait on (each evaluated
# after every workflow event, by the SDK, outside the keeper).
CONDITIONS = ("visibility.py", "notices.py")
SHOWN = ("_keep_status_memo", "_status_signature", "changes", "changes_in", "since", "status", "_refresh",
         "_step_fingerprint")


async def record(path: Path) -> None:
    from _targets import development_target
    from temporalio.testing import WorkflowEnvironment

    from activities.catalog import load_registry
    from runtime.runs import start_run
    from runtime.server_config import dynamic_config_flags
    from runtime.worker import build_worker
    from workflows import search
    from workflows.loader import plan_run

    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.prefix) / "bin" / "temporal"),
        data_converter=DATA_CONVERTER, search_attributes=search.ALL, dev_server_log_level="error",
        dev_server_extra_args=dynamic_config_flags(),
    )
    try:
        book = Path(tempfile.mkdtemp()) / "upkeep.yaml"
        steps = "\n".join(f"  - id: s{i}\n    action: core.wait\n    with: {{seconds: 0}}" for i in range(STEPS))
        book.write_text(f"metadata: {{name: upkeep}}\ntarget: memo-upkeep\nsteps:\n{steps}\n")
        registry = load_registry()
        async with build_worker(env.client, "bench", registry=registry, allow_development=True):
            run = plan_run(book, registry=registry, inventory=development_target("memo-upkeep"), initiator="bench")
            handle = await start_run(env.client, run, "bench")
            await handle.result()
            history = await handle.fetch_history()
        path.write_text(history.to_json())
        print(f"recorded {len(history.events)} events to {path}")
    finally:
        await env.shutdown()


async def replay(history: WorkflowHistory, executor: ThreadPoolExecutor | None = None) -> None:
    replayer = Replayer(workflows=[RunbookWorkflow, FanOutWorkflow], data_converter=DATA_CONVERTER,
                        workflow_runner=UNSANDBOXED_RUNNER, workflow_task_executor=executor)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    if result.replay_failure is not None:
        raise SystemExit(f"replay failed: {result.replay_failure}")


def main(path: Path, rounds: int) -> None:
    history = WorkflowHistory.from_json(WORKFLOW_ID, path.read_text())
    asyncio.run(replay(history))  # warm: imports, the SDK's bridge
    seconds = []
    for _ in range(rounds):
        started = time.process_time()
        asyncio.run(replay(history))
        seconds.append(time.process_time() - started)
    print(f"history: {path} ({len(history.events)} events, {STEPS} steps); {rounds} replays, unsandboxed")
    print(f"replay CPU: median {statistics.median(seconds) * 1000:.0f} ms, "
          f"spread {min(seconds) * 1000:.0f}-{max(seconds) * 1000:.0f} ms")
    # The activations run on the replayer's executor thread: profile that thread.
    profile, executor = cProfile.Profile(), ThreadPoolExecutor(1)
    executor.submit(profile.enable).result()
    asyncio.run(replay(history, executor))
    executor.submit(profile.disable).result()
    executor.shutdown()
    stats = pstats.Stats(profile)
    total = stats.total_tt  # pyright: ignore[reportAttributeAccessIssue]
    keeper = conditions = 0.0
    shown: list[tuple[str, int, float]] = []
    for (file, line, name), (_, calls, _, cumulative, _) in stats.stats.items():  # pyright: ignore[reportAttributeAccessIssue]
        module = Path(file).name
        if "/workflows/" not in file:
            continue
        if name == "_keep_status_memo":
            keeper += cumulative
        elif (module in CONDITIONS and name == "<lambda>") or (module == "step_changes.py" and name == "changed"):
            conditions += cumulative
        if name in SHOWN:
            shown.append((f"{module}:{line} {name}", calls, cumulative))
    print(f"profiled replay: {total * 1000:.0f} ms in all (cProfile, the activations' thread)")
    print(f"  status memo upkeep: {(keeper + conditions) * 1000:.1f} ms ({(keeper + conditions) / total:.1%}): "
          f"the keeper {keeper * 1000:.1f} ms, its and the watchers' conditions {conditions * 1000:.1f} ms")
    for label, calls, cumulative in sorted(shown, key=lambda item: -item[2]):
        print(f"  {label:45s} {calls:7d} calls, {cumulative * 1000:7.1f} ms cumulative ({cumulative / total:5.1%})")

if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("history", type=Path, help="the recorded history (JSON)")
    parser.add_argument("--record", action="store_true", help="record the history first (starts a dev server)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if args.record:
        asyncio.run(record(args.history))
    main(args.history, args.rounds)
