"""The worker exports the step and gate series that infra's alert rules read."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from runtime.catalog import Catalog
from runtime.connection import connect
from runtime.processes import free_port
from tests import support


async def test_step_and_gate_metrics_are_exported(env, task_queue, tmp_path):
    prom = await support.ScriptedPrometheus().start()
    port = free_port()
    runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"127.0.0.1:{port}")))
    client = await connect(runtime=runtime, target_host=env.client.service_client.config.target_host)
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: metered}}
        target: t
        steps:
          - id: g
            gate: {{name: up, endpoint: "{prom.url}", query: up, comparator: ">=", threshold: 1, interval: 0.1s}}
    """)
    try:
        async with support.worker(client, task_queue):
            handle = await support.start(client, book, task_queue)
            await handle.result()
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        await prom.stop()
    assert 'coldstart_step_runs_total{' in text and 'outcome="ok"' in text and 'step="g"' in text
    assert 'coldstart_gate_evaluations_total{' in text and 'result="pass"' in text
    assert 'coldstart_gate_last_result{' in text and 'gate="up"' in text
    assert "coldstart_step_in_progress{" in text


async def test_the_worker_says_whether_it_runs_development_targets(env, task_queue, tmp_path):
    """coldstart_worker_development_targets is 1 on a worker started with --allow-development, 0 on any other."""
    port = free_port()
    runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"127.0.0.1:{port}")))
    client = await connect(runtime=runtime, target_host=env.client.service_client.config.target_host)
    strict = Catalog(Path("runbooks"), tmp_path)
    async with support.worker(client, task_queue), support.worker(client, task_queue + "-strict", catalog=strict):
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    values = {s.labels.get("task_queue"): s.value for family in text_string_to_metric_families(text)
              for s in family.samples if s.name == "coldstart_worker_development_targets"}
    assert values == {task_queue: 1, task_queue + "-strict": 0}, values


def test_a_metrics_port_in_use_is_one_line_naming_the_setting(env, tmp_path):
    """Another process holds the metrics port: the worker exits 2 with one line that names the address and
    the ways to choose another, not Core's traceback."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        done = subprocess.run(
            [sys.executable, "worker.py", "--metrics", address], cwd=Path(__file__).resolve().parents[1],
            env={**os.environ, "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
                 "COLDSTART_SEAL_KEYS": str(tmp_path / "seal-keys")},
            capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    expected = (f"error: the worker's metrics cannot listen on {address}: Failed starting Prometheus exporter: Address "
                "already in use (os error 98); choose another address with --metrics, COLDSTART_METRICS or [worker] "
                "metrics ('' turns them off)")
    assert done.stderr.splitlines() == [expected], done.stderr
