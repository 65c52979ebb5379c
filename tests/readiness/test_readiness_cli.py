"""`coldstart readiness` end to end: workers on a real Temporal queue, real Prometheus, Vault and a Consul snapshot."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from temporalio.client import Client

from activities.catalog import load_registry
from activities.registry import Registry
from lab.hashistack.local import VaultDev
from runtime.action_versions import catalog_build_id
from runtime.readiness.workers import workers_verdict
from runtime.worker import build_worker
from tests import support
from tests.readiness.conftest import SECRET
from tests.readiness.servers import prometheus

REPO = Path(__file__).resolve().parents[2]
STATIC = "scrape_configs:\n  - job_name: node\n    static_configs: [{targets: ['10.0.0.9:9100']}]\n"


async def _polled(client: Client, queue: str, build_id: str) -> None:
    """Until a worker's polls have reached the server."""
    async def seen() -> bool:
        return "no worker" not in (await workers_verdict(client, queue, build_id)).evidence
    await support.wait_for(seen)


async def test_workers_with_this_catalog_are_ready_and_one_without_an_action_is_not(env, task_queue) -> None:
    client = env.client
    registry = support.registry()
    expected = catalog_build_id(registry)
    nobody = await workers_verdict(client, task_queue, expected)
    assert nobody.state == "not_ready" and f"no worker polls {task_queue}" in nobody.evidence
    async with support.worker(client, task_queue):
        await _polled(client, task_queue, expected)
        verdict = await workers_verdict(client, task_queue, expected)
    assert verdict.state == "ready", verdict.evidence
    assert expected in verdict.evidence

    short = f"{task_queue}-short"
    lacking = Registry({name: spec for name, spec in registry.specs.items() if name != min(registry.specs)})
    async with build_worker(client, short, registry=lacking, sandboxed=True,
                            catalog=support.CATALOG, allow_development=True):
        await _polled(client, short, expected)
        verdict = await workers_verdict(client, short, expected)
    assert verdict.state == "not_ready"
    assert f"run other actions than this catalog's {expected}" in verdict.evidence
    assert catalog_build_id(lacking) in verdict.evidence


RUNBOOK = """
version: 1
metadata: {name: ready-demo}
target: ready-t
steps:
  - id: save
    action: consul.snapshot.save
    with: {consul: "${{ target.consul }}", directory: /tmp/forensics}
  - id: select
    action: consul.snapshot.select
    with: {store: "${{ target.facts.snapshot_store }}", before: "${{ params.incident_start }}"}
  - id: leader
    gate: {endpoint: "${{ target.telemetry.prometheus }}", query: "vector(1)", comparator: "==", threshold: 1}
params:
  incident_start: {type: string}
"""


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env}, check=False)


async def test_readiness_of_a_runbook_goes_red_when_its_telemetry_stops_and_exports_metrics(
        env, task_queue, tmp_path: Path, vault: VaultDev, snapshot: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / snapshot.name).write_bytes(snapshot.read_bytes())
    token = tmp_path / "vault-token"
    token.write_text(vault.token)
    targets = tmp_path / "targets"
    targets.mkdir()
    runbook = tmp_path / "ready-demo.yaml"
    runbook.write_text(RUNBOOK)
    metrics = tmp_path / "readiness.prom"
    client = env.client
    registry = load_registry()
    env_vars = {"TEMPORAL_ADDRESS": client.service_client.config.target_host, "COLDSTART_TASK_QUEUE": task_queue,
                "COLDSTART_TARGETS": str(targets)}
    args = ("readiness", str(runbook), "--json", "--metrics-file", str(metrics), "--timeout", "5")
    with prometheus(tmp_path / "prom", STATIC) as prom:
        # The Consul target's address only has to answer (Vault's does, by another name than the telemetry's
        # 127.0.0.1, which would otherwise count as on Consul): no Consul is needed to check the path.
        consul = vault.url.replace("127.0.0.1", "localhost")
        (targets / "ready-t.yaml").write_text(json.dumps({
            "name": "ready-t", "telemetry": {"prometheus": prom},
            "consul": {"address": consul, "token": {"address": vault.url, "path": "coldstart/dns", "field": "tsig",
                                                        "token_file": str(token)}},
            "facts": {"snapshot_store": str(store), "rpo": "24h"}}))
        async with build_worker(client, task_queue, registry=registry, sandboxed=True,
                                catalog=support.CATALOG, allow_development=True):
            await _polled(client, task_queue, catalog_build_id(registry))
            green = await asyncio.to_thread(_cli, env_vars, *args)
            assert green.returncode == 0, green.stdout + green.stderr
            report = json.loads(green.stdout)
            states = {c["check"]: c["state"] for c in report["checks"]}
            assert states == {
                "workers": "ready", "workers.readings": "ready", "temporal.independent": "ready",
                f"telemetry:{prom}": "ready", f"endpoint:{prom}": "ready", f"endpoint:{consul}": "ready", f"endpoint:{vault.url}": "ready",
                "secret:secret/coldstart/dns#tsig": "ready", f"snapshot:{store}": "ready"}, report
            assert SECRET not in green.stdout + green.stderr
            samples = {s.labels["check"]: s.value for family in text_string_to_metric_families(metrics.read_text())
                       if family.name == "coldstart_readiness" for s in family.samples}
            assert samples == dict.fromkeys(states, 1.0)
    async with build_worker(client, task_queue, registry=registry, sandboxed=True,
                            catalog=support.CATALOG, allow_development=True):
        red = await asyncio.to_thread(_cli, env_vars, *args)
        table = await asyncio.to_thread(_cli, {**env_vars, "COLUMNS": "250"}, *args[:2], "--timeout", "5")
    assert red.returncode == 1, red.stdout + red.stderr
    states = {c["check"]: c["state"] for c in json.loads(red.stdout)["checks"]}
    assert states[f"telemetry:{prom}"] == "not_ready" and states[f"endpoint:{prom}"] == "not_ready"
    assert states["workers"] == "ready" and states[f"snapshot:{store}"] == "ready"
    samples = {s.labels["check"]: s.value for family in text_string_to_metric_families(metrics.read_text())
               if family.name == "coldstart_readiness" for s in family.samples}
    assert samples[f"telemetry:{prom}"] == 0.0 and samples["workers"] == 1.0
    assert table.returncode == 1 and "NOT READY" in table.stdout and "the gates are blind" in table.stdout
