"""How many history events a demo-like run writes, and how many of them its gate readings account for.

The repository's runbooks/demo.yaml on the local dev server with the real worker (in this process), against a
Prometheus stand-in (tests/support.py) whose own `up` answers 0: the `ready` gate reads every second until
its minute runs out and holds; the operator (this script) then brings `up` to 1 and retries; `go` is
approved as soon as it waits; every other query answers 1.
Prints the run's event count, by event type, and the gate-reading activities and timers among them.
Never asserts.

    .venv/bin/python bench/history_events.py
"""

from __future__ import annotations

import asyncio
import collections
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _targets import use_development_targets
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from runtime.connection import DATA_CONVERTER
from runtime.runs import start_run
from runtime.server_config import dynamic_config_flags
from runtime.worker import build_worker
from tests.support import ScriptedPrometheus
from workflows import search
from workflows.contract import ApproveRequest, ControlRequest
from workflows.loader import plan_run
from workflows.runbook_workflow import RunbookWorkflow

# telemetry.read and telemetry.read_many, the actions gates read through.
_READS = "telemetry.read"
# The demo's `ready` gate's query; every other query the stand-in answers 1.
_OWN_UP = 'max(up{job="prometheus"})'


async def _drive(handle, prometheus: ScriptedPrometheus) -> None:
    """The operator: once `ready` holds, bring the stand-in's own `up` to 1 and retry; approve `go` when it waits."""
    retried = approved = False
    while True:
        status = await handle.query(RunbookWorkflow.status)
        if status.state != "running":
            return
        if "ready" in status.held and not retried:
            prometheus.script(_OWN_UP, 1)
            await handle.execute_update("retry", ControlRequest(step="ready", actor="bob", reason="prometheus is up"))
            retried = True
        if "go" in status.awaiting_approval and not approved:
            await handle.execute_update("approve", ApproveRequest(step="go", approver="bob", comment="bench"))
            approved = True
        await asyncio.sleep(0.5)


async def main() -> None:
    from activities.catalog import load_registry

    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.prefix) / "bin" / "temporal"),
        data_converter=DATA_CONVERTER, search_attributes=search.ALL, dev_server_log_level="error",
        dev_server_extra_args=dynamic_config_flags(),
    )
    prometheus = ScriptedPrometheus()
    prometheus.script(_OWN_UP, 0)  # until the operator brings it up
    try:
        await prometheus.start()
        inventory = {"name": "bench-demo", "development": True, "telemetry": {"prometheus": prometheus.url}}
        (use_development_targets() / "bench-demo.yaml").write_text(
            f"name: bench-demo\ndevelopment: true\ntelemetry: {{prometheus: '{prometheus.url}'}}\n")
        registry = load_registry()
        async with build_worker(env.client, "bench", registry=registry, allow_development=True):
            run = plan_run(ROOT / "runbooks" / "demo.yaml", registry=registry, inventory=inventory, initiator="bench")
            started = time.monotonic()
            handle = await start_run(env.client, run, "bench")
            await _drive(handle, prometheus)
            wall = time.monotonic() - started
            history = await handle.fetch_history()
            status = await handle.query(RunbookWorkflow.status)
    finally:
        await prometheus.stop()
        await env.shutdown()
    kinds = collections.Counter(EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in history.events)
    readings = sum(1 for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                   and e.activity_task_scheduled_event_attributes.activity_type.name.startswith(_READS))
    read = sum(len(s.readings) for s in status.steps)
    print(f"demo run ({run.runbook.metadata.name}, the ready gate held once): {status.state} in {wall:.1f}s wall, "
          f"{len(history.events)} history events")
    print(f"gate readings kept by the run: {read}; reading activities scheduled: {readings}; "
          f"timers started: {kinds['TIMER_STARTED']}")
    for kind, count in kinds.most_common():
        print(f"  {count:5d}  {kind}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    asyncio.run(main())
