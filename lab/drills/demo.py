"""The demo drill: a dev server, a worker and a Prometheus on this machine, the demo runbook run as a drill, a report."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from activities.catalog import load_registry
from cli import render
from cli.report import keep
from cli.scorecard import Scorecard, score
from cli.timeline import build_timeline, render_markdown
from runtime.connection import connect
from runtime.polling import read_kept_status
from runtime.processes import free_port, start_process
from runtime.runs import start_run
from runtime.server_config import dev_server_argv
from workflows.contract import ApproveRequest
from workflows.loader import plan_run

__all__ = ["DRILL_APPROVER", "DrillReport", "auto_approve", "run_demo_drill"]

DRILL_APPROVER = "drill-bot"


@dataclass
class DrillReport:
    outcome: str
    wall_seconds: float
    timeline_markdown: str
    report_path: Path
    scorecard: Scorecard | None = None  # against the runbook's objectives; kept in scorecard_path
    scorecard_path: Path | None = None


def _prometheus_config(path: Path, prometheus_port: int, worker_metrics_port: int) -> None:
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{prometheus_port}"]}]},
            {"job_name": "coldstart_worker", "static_configs": [{"targets": [f"127.0.0.1:{worker_metrics_port}"]}]},
        ],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))


async def auto_approve(client, workflow_id: str, console: Console,
                        identity_token: Callable[[Any], str] | None = None) -> None:
    """The drill approver: approves whatever waits, as the runbook's allow-list permits.

    identity_token: fetches a fresh token for each approval from its cli.identity.DecisionSource (the run's
    provider and the approval's nonce), when the runbook requires verified identity."""
    from cli.identity import decision_source

    handle = client.get_workflow_handle(workflow_id)
    while True:
        try:
            # From the server, five times a second: a Query would cost the drill's own worker each time.
            current = await read_kept_status(handle, attempts=1)
        except Exception:  # noqa: BLE001 - server busy or restarting; try again
            await asyncio.sleep(0.5)
            continue
        if current.over:
            return
        for step in current.awaiting_approval:
            try:
                token = None
                if identity_token is not None:
                    source, _ = await decision_source(handle, "approve", step)
                    token = await asyncio.to_thread(identity_token, source)
                await handle.execute_update(
                    "approve", ApproveRequest(step=step, approver=DRILL_APPROVER, comment="drill: approved automatically",
                                              identity_token=token)
                )
            except Exception as exc:  # noqa: BLE001 - already approved, or refused: say so and go on
                console.print(f"drill approver: {step}: {exc}", style="yellow", highlight=False)
        await asyncio.sleep(0.2)


async def run_demo_drill(state_dir: Path, console: Console, *, interactive: bool = False) -> DrillReport:
    """The demo drill: a Temporal dev server, a Prometheus, a worker, and runbooks/demo.yaml."""
    from runtime.catalog import Catalog
    from runtime.worker import build_worker

    state_dir.mkdir(parents=True, exist_ok=True)
    temporal_port, ui_port, prom_port, metrics_port = free_port(), free_port(), free_port(), free_port()
    prometheus = shutil.which("prometheus") or "/usr/bin/prometheus"
    prom_dir = state_dir / "prometheus"
    shutil.rmtree(prom_dir, ignore_errors=True)
    prom_dir.mkdir(parents=True)
    _prometheus_config(prom_dir / "prometheus.yml", prom_port, metrics_port)
    targets = state_dir / "targets"
    targets.mkdir(exist_ok=True)
    (targets / "local.yaml").write_text(
        yaml.safe_dump({"name": "local", "drill": True, "telemetry": {"prometheus": f"http://127.0.0.1:{prom_port}"}})
    )
    started = time.monotonic()
    with start_process(
        dev_server_argv(state_dir / "temporal.db", temporal_port, ui_port=ui_port),
        log=state_dir / "temporal.log", port=temporal_port,
    ), start_process(
        [prometheus, f"--config.file={prom_dir / 'prometheus.yml'}", f"--storage.tsdb.path={prom_dir / 'data'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        log=state_dir / "prometheus.log", port=prom_port,
    ):
        console.print(f"Temporal 127.0.0.1:{temporal_port}, Web UI http://127.0.0.1:{ui_port}, "
                      f"Prometheus http://127.0.0.1:{prom_port}", highlight=False)
        runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"127.0.0.1:{metrics_port}")))
        client = await connect(runtime=runtime, target_host=f"127.0.0.1:{temporal_port}", namespace="default",
                               ready_within=60)
        run = plan_run(
            Path("runbooks/demo.yaml"), registry=load_registry(), targets_dir=targets,
            initiator=os.environ.get("COLDSTART_USER", "drill"), drill=True,
        )
        queue = f"coldstart-drill-{os.getpid()}"
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(build_worker(client, queue, catalog=Catalog(Path("runbooks"), targets)))
            handle = await start_run(client, run, queue)
            console.print(f"drill run {handle.id} started", highlight=False)
            approver = None
            if interactive:
                console.print(f"approve in the Web UI: http://127.0.0.1:{ui_port}/namespaces/default/workflows/{handle.id}",
                              highlight=False)
            else:
                approver = asyncio.create_task(auto_approve(client, handle.id, console))
            code = await render.follow(client, handle.id, console)
            if approver:
                approver.cancel()
        timeline = await build_timeline(client, handle.id)
    wall = time.monotonic() - started
    markdown = render_markdown(timeline)
    report_path = state_dir / "report.md"
    report_path.write_text(markdown)
    card = score(timeline)
    # The drill's Temporal goes with it: its scorecard is kept beside the report, for `coldstart report --file`.
    kept_in = keep(card, state_dir / "scorecards.jsonl") if card is not None else None
    return DrillReport(outcome="succeeded" if code == 0 else timeline.outcome, wall_seconds=wall,
                       timeline_markdown=markdown, report_path=report_path, scorecard=card, scorecard_path=kept_in)
