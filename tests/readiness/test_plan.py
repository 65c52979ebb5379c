"""The checks come from the planned run: the shipped cold-start runbook, planned against its cases' inventory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from activities.catalog import load_contracts
from activities.inventory import Inventory
from runtime.independence import resolver_violations
from runtime.readiness import ReadinessSettings, plan_checks
from runtime.readiness.path import through_block_verdict
from workflows.loader import plan_run

REPO = Path(__file__).resolve().parents[2]


async def _never():  # the checks are only listed here, never run
    raise AssertionError("no check runs in this test")


def _planned(**facts: object):
    inventory = yaml.safe_load((REPO / "runbooks/cases/consul-cold-start.yaml").read_text())["target"]
    inventory["facts"].update(facts)
    return plan_run(REPO / "runbooks/consul-cold-start.yaml", registry=load_contracts(), inventory=inventory,
                    placeholders=True)


def _settings() -> ReadinessSettings:
    return ReadinessSettings(connect=_never, frontend="temporal.test:7233", task_queue="coldstart", build_id="actions-x")


def test_the_cold_start_runbook_gets_a_check_for_each_part_of_its_path() -> None:
    checks = {c.name: c.kind for c in plan_checks(_planned(rpo="26h"), _settings())}
    assert checks == {
        "workers": "workers",
        "workers.readings": "workers",
        "temporal.independent": "independence",
        "telemetry:http://prometheus.test:9090": "telemetry",
        "endpoint:http://consul-1.test:8500": "endpoint",
        "endpoint:http://consul-2.test:8500": "endpoint",
        "endpoint:http://internal.test:8500": "endpoint",
        "endpoint:http://nomad.test:4646": "endpoint",
        "endpoint:http://prometheus.test:9090": "endpoint",
        "endpoint:http://vault.test:8200": "endpoint",
        # dns.steer.set's key: resolved and signing, one check.
        "tsig:coldstart-steer.": "secret",
        "snapshot:/var/lib/coldstart/snapshots": "snapshot",
        "nomad.capacity:cache": "capacity",
        # block-consul shuts clients out of the servers (not the internal client agent): the controller must stay in.
        "out-of-band:http://consul-1.test:8500": "endpoint",
        "out-of-band:http://consul-2.test:8500": "endpoint",
    }


def test_a_target_objective_that_is_not_a_duration_is_refused() -> None:
    with pytest.raises(ValueError, match="facts.rpo 'daily' is not a duration"):
        plan_checks(_planned(rpo="daily"), _settings())


def test_the_trial_restore_is_checked_only_when_asked() -> None:
    settings = _settings()
    settings.trial_restore = True
    names = [c.name for c in plan_checks(_planned(), settings)]
    assert "snapshot.trial:/var/lib/coldstart/snapshots" in names
    assert "snapshot.trial:/var/lib/coldstart/snapshots" not in [c.name for c in plan_checks(_planned(), _settings())]


def test_the_command_refuses_bad_input_in_one_line_and_documents_itself(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cli.main", "readiness", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=60, check=False, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})

    usage = cli("--help")
    assert usage.returncode == 0
    for option in ("--target", "--json", "--metrics-file", "--push", "--timeout", "--schedule", "--trial-restore"):
        assert option in usage.stdout
    missing = cli(str(tmp_path / "nothing.yaml"), "--target", "lab")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nmetadata: {name: bad}\ntarget: local\nsteps:\n  - {id: a, action: no.such.action}\n")
    refused = cli(str(bad), "--target", "local")
    assert refused.returncode == 2 and "no.such.action" in refused.stderr


def test_a_resolver_that_goes_through_consul_is_a_dependency() -> None:
    inventory = Inventory.model_validate({"name": "t", "telemetry": {"prometheus": "http://10.0.0.9:9090"},
                                          "consul": {"address": "http://10.0.0.11:8500"}})
    assert resolver_violations("nameserver 10.0.0.53\nsearch example.com\n", inventory) == []
    assert resolver_violations("nameserver 10.0.0.11\nsearch service.consul example.com\n", inventory) == [
        "resolv.conf line 1: nameserver 10.0.0.11 is on consul, which the runbooks restore",
        "resolv.conf line 2: search service.consul example.com: short names resolve through Consul"]


async def test_the_independence_check_reads_this_hosts_resolver(tmp_path: Path) -> None:
    settings = _settings()
    settings.resolv_conf = tmp_path / "resolv.conf"
    settings.resolv_conf.write_text("nameserver 10.0.0.53\n")
    check = next(c for c in plan_checks(_planned(), settings) if c.name == "temporal.independent")
    assert (await check.probe()).state == "ready"
    settings.resolv_conf.write_text("nameserver 10.0.0.53\nsearch node.dc1.consul\n")
    verdict = await check.probe()
    assert verdict.state == "not_ready" and "short names resolve through Consul" in verdict.evidence


async def test_an_endpoint_behind_the_block_is_reachable_out_of_band_only_from_an_allowed_tier() -> None:
    allowed = await through_block_verdict("http://127.0.0.1:8500", {"controller": ["127.0.0.0/8"]}, "block-consul")
    assert allowed.state == "ready" and "as tier controller" in allowed.evidence
    shut_out = await through_block_verdict("http://127.0.0.1:8500", {"controller": ["10.0.0.1/32"],
                                                                      "telemetry": ["10.0.0.9/32"]}, "block-consul")
    assert shut_out.state == "not_ready"
    assert "this host (127.0.0.1) is in no allowed tier (controller, telemetry)" in shut_out.evidence
