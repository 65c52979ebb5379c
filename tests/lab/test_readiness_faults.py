"""Readiness of the cold-start runbook on the lab: each fault turns its check red, `clear` turns it green again."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from activities.catalog import load_registry
from activities.registry import Registry
from lab.faults import inject
from runtime.action_versions import catalog_build_id
from runtime.readiness import ReadinessSettings, Report, plan_checks, run_checks
from runtime.readiness.vault_login import worker_vault_token
from runtime.readiness.workers import workers_verdict
from runtime.worker import build_worker
from tests import support
from workflows.loader import plan_run

pytestmark = pytest.mark.timeout(900)  # the first lab test of a session also brings the lab up

RUNBOOK = Path(__file__).resolve().parents[2] / "runbooks" / "consul-cold-start.yaml"

# fault -> (the check it must turn red, what its evidence must say)
FAULTS = {
    "snapshot-stale": ("snapshot:", "older than the objective 24h"),
    "snapshot-corrupt": ("snapshot:", "sha256 mismatch for state.bin"),
    "tsig-wrong": ("tsig:coldstart-steer.", "refused the key"),
    "vault-sealed": ("vault.approle", "Vault is sealed"),
    "prometheus-consul-sd": ("telemetry:", "game.service.consul, a Consul DNS name"),
    "nomad-node-drained": ("nomad.capacity:cache", "cannot go back on cache"),
}


async def _report(cfg, client, queue: str, registry: Registry, *, trial_restore: bool = False) -> Report:
    inventory = yaml.safe_load(cfg.inventory_path.read_text())
    run = plan_run(RUNBOOK, registry=registry, inventory=inventory, placeholders=True)

    async def connected():
        return client

    settings = ReadinessSettings(connect=connected, frontend=client.service_client.config.target_host,
                                 task_queue=queue, build_id=catalog_build_id(registry), timeout=20.0,
                                 trial_restore=trial_restore)
    async with worker_vault_token(run.target) as login:
        return await run_checks(run.runbook.metadata.name, run.target_name,
                                plan_checks(run, replace(settings, vault=login)))


def _states(report: Report) -> dict[str, tuple[str, str]]:
    return {r.check: (r.state, r.evidence) for r in report.results}


def _not_ready(report: Report) -> dict[str, str]:
    return {check: evidence for check, (state, evidence) in _states(report).items() if state != "ready"}


async def _polled(client, queue: str, build_id: str) -> None:
    async def seen() -> bool:
        verdict = await workers_verdict(client, queue, build_id)
        return "no worker" not in verdict.evidence
    await support.wait_for(seen, timeout=30)


async def test_each_fault_turns_its_readiness_check_red_and_clear_turns_it_green(lab, env, task_queue,
                                                                                 monkeypatch) -> None:
    cfg, _ = lab
    # A controller without a Vault token of its own: the checks log in with the target's AppRole. (A drill
    # earlier in the session leaves the worker's token for its own, gone, Vault in the environment.)
    monkeypatch.delenv("VAULT_TOKEN", raising=False)
    client = env.client
    registry = load_registry()
    build_id = catalog_build_id(registry)
    async with build_worker(client, task_queue, registry=registry, catalog=support.CATALOG, allow_development=True):
        await _polled(client, task_queue, build_id)
        baseline = await _report(cfg, client, task_queue, registry, trial_restore=True)
        assert _not_ready(baseline) == {}, _not_ready(baseline)
        trial = next(evidence for check, (_, evidence) in _states(baseline).items() if check.startswith("snapshot.trial:"))
        assert "keys" in trial and "restored" in trial, trial

        for fault, (check, says) in FAULTS.items():
            await asyncio.to_thread(inject, cfg, fault)
            try:
                red = _not_ready(await _report(cfg, client, task_queue, registry))
            finally:
                await asyncio.to_thread(inject, cfg, "clear")
            hit = {name: evidence for name, evidence in red.items() if name.startswith(check)}
            assert hit and any(says in evidence for evidence in hit.values()), (fault, red)
            if fault != "vault-sealed":  # a sealed Vault also fails every secret read: that is the point
                assert set(red) == set(hit), (fault, red)
            green = _not_ready(await _report(cfg, client, task_queue, registry))
            assert green == {}, (fault, "after clear", green)

    # A worker without one of the catalog's actions: the runbook's queue is not ready, and names it.
    short = f"{task_queue}-short"
    lacking = Registry({name: spec for name, spec in registry.specs.items() if name != "consul.snapshot.restore"})
    async with build_worker(client, short, registry=lacking, catalog=support.CATALOG, allow_development=True):
        await _polled(client, short, build_id)
        red = _not_ready(await _report(cfg, client, short, registry))
    assert set(red) >= {"workers"}, red
    assert catalog_build_id(lacking) in red["workers"] and "run other actions" in red["workers"], red
