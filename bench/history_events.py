"""How many history events a demo-like run writes, and how many of them its gate readings account for.

The repository's runbooks/demo.yaml on the local dev server with the real worker (in this process), against a
Prometheus stand-in whose `max(up{job="prometheus"})` answers 0 for the first `--down` seconds and 1 after:
the `ready` gate reads every second until its minute runs out, holds, and is retried once the stand-in
answers 1 (as an operator would); `go` is approved as soon as it waits; the ramp's gates read 1 at once.
Prints the run's event count, by event type, and the gate-reading activities and timers among them.
Never asserts.

    .venv/bin/python bench/history_events.py [--down=70]
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
from aiohttp import web
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from runtime.connection import DATA_CONVERTER
from runtime.runs import start_run
from runtime.server_config import dynamic_config_flags
from runtime.worker import build_worker
from workflows import search
from workflows.contract import ApproveRequest, ControlRequest
from workflows.loader import plan_run
from workflows.runbook_workflow import RunbookWorkflow

# telemetry.read and telemetry.read_many, the actions gates read through.
_READS = "telemetry.read"


class _Prometheus:
    """Answers the demo's queries: its own `up` is 0 until `down` seconds after start, every other 1 (3 targets)."""

    def __init__(self, down: float) -> None:
        self.up_at = time.monotonic() + down
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _query(self, request: web.Request) -> web.Response:
        query = request.query.get("query", "")
        value = 3 if query.startswith("count") else (0 if "prometheus" in query and time.monotonic() < self.up_at else 1)
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {}, "value": [time.time(), str(value)]}]}})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/query", self._query)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()


async def _drive(handle, prometheus: _Prometheus) -> None:
    """The operator: retry `ready` once it holds and the stand-in answers 1; approve `go` when it waits."""
    retried = approved = False
    while True:
        status = await handle.query(RunbookWorkflow.status)
        if status.state != "running":
            return
        if "ready" in status.held and not retried and time.monotonic() >= prometheus.up_at:
            await handle.execute_update("retry", ControlRequest(step="ready", actor="bob", reason="prometheus is up"))
            retried = True
        if "go" in status.awaiting_approval and not approved:
            await handle.execute_update("approve", ApproveRequest(step="go", approver="bob", comment="bench"))
            approved = True
        await asyncio.sleep(0.5)


async def main(down: float) -> None:
    from activities.catalog import load_registry

    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.prefix) / "bin" / "temporal"),
        data_converter=DATA_CONVERTER, search_attributes=search.ALL, dev_server_log_level="error",
        dev_server_extra_args=dynamic_config_flags(),
    )
    prometheus = _Prometheus(down)
    try:
        await prometheus.start()
        inventory = {"name": "bench-demo", "development": True, "telemetry": {"prometheus": prometheus.url}}
        (use_development_targets() / "bench-demo.yaml").write_text(
            f"name: bench-demo\ndevelopment: true\ntelemetry: {{prometheus: '{prometheus.url}'}}\n")
        registry = load_registry()
        async with build_worker(env.client, "bench", registry=registry):
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
    print(f"demo run ({run.runbook.metadata.name}, prometheus down {down:g}s): {status.state} in {wall:.1f}s wall, "
          f"{len(history.events)} history events")
    print(f"gate readings kept by the run: {read}; reading activities scheduled: {readings}; "
          f"timers started: {kinds['TIMER_STARTED']}")
    for kind, count in kinds.most_common():
        print(f"  {count:5d}  {kind}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--down", type=float, default=70.0, help="seconds the stand-in's own `up` answers 0")
    asyncio.run(main(parser.parse_args().down))
