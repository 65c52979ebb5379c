"""Readiness on a Temporal Schedule: `coldstart readiness --schedule` creates it, a worker runs the check from its catalog."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from runtime.catalog import Catalog
from runtime.worker import build_worker
from tests import support
from workflows.readiness import readiness_schedule_id

REPO = Path(__file__).resolve().parents[2]
RUNBOOK = """
version: 1
metadata: {name: scheduled-ready}
target: sched-t
steps:
  - id: leader
    gate: {endpoint: "${{ target.telemetry.prometheus }}", query: "vector(1)", comparator: "==", threshold: 1}
"""


async def test_a_scheduled_check_runs_on_the_worker_and_writes_its_metrics(env, task_queue, tmp_path: Path) -> None:
    runbooks, targets = tmp_path / "runbooks", tmp_path / "targets"
    runbooks.mkdir()
    targets.mkdir()
    (runbooks / "scheduled-ready.yaml").write_text(RUNBOOK)
    # Nothing listens on port 9 (discard): the gates' Prometheus is down.
    (targets / "sched-t.yaml").write_text(json.dumps({"name": "sched-t", "telemetry": {"prometheus": "http://127.0.0.1:9"}}))
    metrics = tmp_path / "worker-textfiles" / "readiness.prom"
    metrics.parent.mkdir()
    client = env.client
    made = await asyncio.to_thread(subprocess.run, [
        sys.executable, "-m", "cli.main", "readiness", str(runbooks / "scheduled-ready.yaml"), "--schedule", "0 6 * * *",
        "--metrics-file", str(metrics), "--timeout", "3"], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "TEMPORAL_ADDRESS": client.service_client.config.target_host,
             "COLDSTART_TASK_QUEUE": task_queue, "COLDSTART_TARGETS": str(targets)}, check=False)
    assert made.returncode == 0, made.stdout + made.stderr
    schedule_id = readiness_schedule_id("scheduled-ready", "sched-t")
    assert f"schedule {schedule_id}: readiness of scheduled-ready on sched-t at '0 6 * * *'" in made.stdout
    handle = client.get_schedule_handle(schedule_id)
    async with build_worker(client, task_queue, registry=support.registry(), sandboxed=True,
                            catalog=Catalog(runbooks, targets)):
        await handle.trigger()

        async def started() -> str | None:
            actions = (await handle.describe()).info.recent_actions
            return actions[-1].action.workflow_id if actions else None

        workflow_id = await support.wait_for(started)
        report = await client.get_workflow_handle(workflow_id, result_type=dict).result()
    await handle.delete()
    states = {c["check"]: c["state"] for c in report["checks"]}
    assert report["state"] == "not_ready"
    assert states["workers"] == "ready" and states["workers.readings"] == "ready"
    assert states["telemetry:http://127.0.0.1:9"] == "not_ready"
    samples = {s.labels["check"]: s.value for family in text_string_to_metric_families(metrics.read_text())
               if family.name == "coldstart_readiness" for s in family.samples}
    assert samples == {check: {"ready": 1.0, "not_ready": 0.0, "unknown": -1.0}[state] for check, state in states.items()}
