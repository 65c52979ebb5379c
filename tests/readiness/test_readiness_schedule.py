"""Readiness on a Temporal Schedule: `coldstart readiness --schedule` creates it, a worker runs the check from its
catalog and writes the metrics where the worker's own configuration says; a request naming a file or URL is refused."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError
from temporalio.client import WorkflowFailureError

from runtime.catalog import Catalog
from runtime.readiness.scheduled import METRICS_DIR_ENV, PUSH_ENV, ReadinessExport
from runtime.worker import build_worker
from tests import support
from workflows.readiness import ReadinessRequest, ReadinessWorkflow, readiness_schedule_id

REPO = Path(__file__).resolve().parents[2]
RUNBOOK = """
version: 1
metadata: {name: scheduled-ready}
target: sched-t
steps:
  - id: leader
    gate: {endpoint: "${{ target.telemetry.prometheus }}", query: "vector(1)", comparator: "==", threshold: 1}
"""


def _catalog(tmp_path: Path) -> tuple[Path, Path]:
    runbooks, targets = tmp_path / "runbooks", tmp_path / "targets"
    runbooks.mkdir()
    targets.mkdir()
    (runbooks / "scheduled-ready.yaml").write_text(RUNBOOK)
    # Nothing listens on port 9 (discard): the gates' Prometheus is down.
    (targets / "sched-t.yaml").write_text(json.dumps({"name": "sched-t", "telemetry": {"prometheus": "http://127.0.0.1:9"}}))
    return runbooks, targets


def _cli(client, task_queue: str, targets: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", "readiness", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**os.environ, "TEMPORAL_ADDRESS": client.service_client.config.target_host,
                               "COLDSTART_TASK_QUEUE": task_queue, "COLDSTART_TARGETS": str(targets)})


async def test_a_scheduled_check_runs_on_the_worker_and_writes_its_metrics(env, task_queue, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    runbooks, targets = _catalog(tmp_path)
    textfiles = tmp_path / "worker-textfiles"
    textfiles.mkdir()
    client = env.client
    made = await asyncio.to_thread(_cli, client, task_queue, targets, str(runbooks / "scheduled-ready.yaml"),
                                   "--schedule", "0 6 * * *", "--timeout", "3")
    assert made.returncode == 0, made.stdout + made.stderr
    schedule_id = readiness_schedule_id("scheduled-ready", "sched-t")
    assert f"schedule {schedule_id}: readiness of scheduled-ready on sched-t at '0 6 * * *'" in made.stdout
    handle = client.get_schedule_handle(schedule_id)
    # The worker's own configuration, read when it starts, says where its metrics go.
    monkeypatch.setenv(METRICS_DIR_ENV, str(textfiles))
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
    metrics = textfiles / "coldstart_readiness_scheduled-ready_sched-t.prom"
    samples = {s.labels["check"]: s.value for family in text_string_to_metric_families(metrics.read_text())
               if family.name == "coldstart_readiness" for s in family.samples}
    assert samples == {check: {"ready": 1.0, "not_ready": 0.0, "unknown": -1.0}[state] for check, state in states.items()}


async def test_a_request_that_names_a_file_or_url_is_refused_and_nothing_is_written(
        env, task_queue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whoever can start a workflow or edit a Schedule chooses no file the worker overwrites and no URL it sends to."""
    runbooks, targets = _catalog(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("kept\n")
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        ReadinessRequest.model_validate({"runbook": "scheduled-ready", "target": "sched-t", "metrics_file": str(victim)})
    monkeypatch.delenv(METRICS_DIR_ENV, raising=False)
    monkeypatch.delenv(PUSH_ENV, raising=False)
    client = env.client
    async with build_worker(client, task_queue, registry=support.registry(), sandboxed=True,
                            catalog=Catalog(runbooks, targets)):
        with pytest.raises(WorkflowFailureError) as failure:
            await client.execute_workflow(
                ReadinessWorkflow.run, {"runbook": "scheduled-ready", "target": "sched-t", "metrics_file": str(victim),
                                        "push": "http://127.0.0.1:9/"},
                id=f"readiness-forged-{task_queue}", task_queue=task_queue)
        message = _message(failure.value)
        assert message == ("readiness request refused: metrics_file is not a readiness request field; push is not a "
                           "readiness request field"), message
        # A target that is not a name, or not in the catalog, is refused in one line too.
        with pytest.raises(WorkflowFailureError) as failure:
            await client.execute_workflow(ReadinessWorkflow.run, {"runbook": "scheduled-ready", "target": "../targets/sched-t"},
                                          id=f"readiness-path-{task_queue}", task_queue=task_queue)
        assert _message(failure.value).startswith("readiness request refused: target name '../targets/sched-t' is refused"), \
            failure.value
        with pytest.raises(WorkflowFailureError) as failure:
            await client.execute_workflow(ReadinessWorkflow.run, {"runbook": "scheduled-ready", "target": "elsewhere"},
                                          id=f"readiness-elsewhere-{task_queue}", task_queue=task_queue)
        assert _message(failure.value).startswith("target 'elsewhere' is not in the controller's catalog: its inventory goes in "), failure.value
    assert victim.read_text() == "kept\n"
    # The CLI says where a scheduled check's metrics go instead of sending a path.
    refused = await asyncio.to_thread(_cli, client, task_queue, targets, str(runbooks / "scheduled-ready.yaml"),
                                      "--schedule", "0 6 * * *", "--metrics-file", str(victim))
    assert refused.returncode == 2 and "$COLDSTART_READINESS_METRICS_DIR" in refused.stderr, refused.stderr


def _message(failure: WorkflowFailureError) -> str:
    """The innermost cause's message: the workflow's own refusal, or its activity's."""
    cause: BaseException | None = failure.cause
    while getattr(cause, "cause", None) is not None:
        cause = cause.cause  # type: ignore[union-attr]
    message = getattr(cause, "message", str(cause))
    assert "\n" not in message
    return message


def test_the_workers_export_comes_from_its_environment(tmp_path: Path) -> None:
    export = ReadinessExport.from_environment({METRICS_DIR_ENV: str(tmp_path), PUSH_ENV: "http://pushgateway.test:9091"})
    assert export.textfile("scheduled-ready", "sched-t") == tmp_path / "coldstart_readiness_scheduled-ready_sched-t.prom"
    assert export.push == "http://pushgateway.test:9091"
    assert ReadinessExport.from_environment({}) == ReadinessExport()
    with pytest.raises(ValueError, match=r"\$COLDSTART_READINESS_PUSH is not a Pushgateway URL"):
        ReadinessExport.from_environment({PUSH_ENV: "file:///etc/passwd"})
