"""Nomad and Vault actions against their stand-ins, through python-nomad and hvac."""

from __future__ import annotations

import dataclasses
import json
import time

import nomad
import pytest
import requests
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import nomad as na
from activities import vault as va

from .conftest import CONSUL_TOKEN


def job(name: str, count: int) -> dict:
    return {"ID": name, "TaskGroups": [{"Name": "cache", "Count": count,
                                        "Tasks": [{"Name": "redis", "Driver": "raw_exec"}]}]}


def api(stack) -> nomad.Nomad:
    return nomad.Nomad(host="127.0.0.1", port=stack.nomad.port, timeout=10)


def wait_running(n: nomad.Nomad, job_id: str, count: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        allocs = n.job.get_allocations(job_id)
        if sum(a["ClientStatus"] == "running" and a["DesiredStatus"] == "run" for a in allocs) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{job_id}: {count} allocations not running")


def test_scale_records_previous_and_undo_restores(stack):
    n = api(stack)
    n.job.register_job("sc1", {"Job": job("sc1", 4)})
    target = stack.nomad_target()
    out = na.jobs_scale(na.ScaleInput(nomad=target, job="sc1", count=1))
    assert out.changed and out.previous_count == 4 and out.group == "cache"
    assert n.job.get_job("sc1")["TaskGroups"][0]["Count"] == 1
    assert not na.jobs_scale(na.ScaleInput(nomad=target, job="sc1", count=1)).changed
    back = na.jobs_scale(out.undo)
    assert back.changed and n.job.get_job("sc1")["TaskGroups"][0]["Count"] == 4
    with pytest.raises(ApplicationError) as err:
        na.jobs_scale(na.ScaleInput(nomad=target, job="sc1", group="nope", count=1))
    assert err.value.non_retryable
    with pytest.raises(ApplicationError) as err:
        na.jobs_scale(na.ScaleInput(nomad=target, job="missing", count=1))
    assert err.value.non_retryable and err.value.type == "NotFound"


def test_quarantine_ready_node_failing_allocations_and_undo(stack):
    n = api(stack)
    n.job.register_job("spread", {"Job": job("spread", 3)})
    wait_running(n, "spread", 3)
    requests.post(f"{stack.nomad.url}/_lab/faults", json={"fault": "unhealthy-node-eligible", "node": "cache2"},
                  timeout=5).raise_for_status()
    try:
        deadline = time.monotonic() + 10
        while not any(a["ClientStatus"] == "failed" for a in n.job.get_allocations("spread")):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        target = stack.nomad_target()
        inp = na.QuarantineInput(nomad=target, failed_allocs_within_minutes=10)
        out = na.nodes_quarantine_unhealthy(inp)
        assert [v.name for v in out.quarantined] == ["cache2"]
        assert sorted(out.healthy) == ["cache1", "cache3"]
        node = next(x for x in n.nodes.get_nodes() if x["Name"] == "cache2")
        assert node["SchedulingEligibility"] == "ineligible" and node["Status"] == "ready"
        again = na.nodes_quarantine_unhealthy(inp)
        assert again.quarantined == [] and "cache2" in again.skipped
        undo = na.nodes_restore_eligibility(out.undo)
        assert undo.made_eligible == ["cache2"]
        assert na.nodes_restore_eligibility(out.undo).unchanged == ["cache2"]
        with pytest.raises(ApplicationError) as err:  # a probe failing everywhere is refused
            na.nodes_quarantine_unhealthy(na.QuarantineInput(nomad=target, probes=[
                na.NodeProbe(node=name, url="http://127.0.0.1:1/") for name in ("cache1", "cache2", "cache3")]))
        assert err.value.non_retryable and err.value.type == "TooMany"
        assert all(x["SchedulingEligibility"] == "eligible" for x in n.nodes.get_nodes())
    finally:
        requests.post(f"{stack.nomad.url}/_lab/faults", json={"fault": "clear"}, timeout=5)


def test_redeploy_from_scratch_records_spec_and_waits_healthy(stack):
    n = api(stack)
    n.job.register_job("cacheA", {"Job": job("cacheA", 2)})
    wait_running(n, "cacheA", 2)
    old = {a["ID"] for a in n.job.get_allocations("cacheA")}
    env = ActivityEnvironment()
    beats = []
    env.on_heartbeat = lambda *d: beats.append(d[0] if d else None)
    out = env.run(na.job_redeploy_from_scratch, na.RedeployInput(nomad=stack.nomad_target(), job="cacheA",
                                                                 poll_seconds=0.05, deadline_seconds=20))
    assert out.spec_source == "recorded" and out.purged and out.expected == 2
    assert len(out.allocations) == 2 and not ({a.id for a in out.allocations} & old)
    assert any(isinstance(b, dict) and b.get("phase") == "wait" for b in beats)
    assert n.job.get_job("cacheA")["Version"] == 0  # purged: a fresh job, not version 1


def test_redeploy_resumes_after_a_crash_between_purge_and_register(stack):
    n = api(stack)
    spec = na._clean(job("cacheB", 1))
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_details=[
        {"job": "cacheB", "phase": "register", "spec": spec, "source": "recorded", "t0": time.time()}])
    out = env.run(na.job_redeploy_from_scratch, na.RedeployInput(nomad=stack.nomad_target(), job="cacheB",
                                                                 poll_seconds=0.05, deadline_seconds=20))
    assert out.spec_source == "recorded" and len(out.allocations) == 1
    with pytest.raises(ApplicationError) as err:
        na.job_redeploy_from_scratch(na.RedeployInput(nomad=stack.nomad_target(), job="never-existed"))
    assert err.value.non_retryable


def test_redeploy_system_job_expects_eligible_nodes_and_returns_endpoints(stack):
    n = api(stack)
    spec = job("cacheS", 1)
    spec.update(Type="system")
    spec["TaskGroups"][0]["Networks"] = [{"ReservedPorts": [{"Label": "redis", "Value": 16380}]}]
    n.job.register_job("cacheS", {"Job": spec})
    eligible = [x for x in n.nodes.get_nodes() if x["SchedulingEligibility"] == "eligible"]
    wait_running(n, "cacheS", len(eligible))
    env = ActivityEnvironment()
    out = env.run(na.job_redeploy_from_scratch, na.RedeployInput(nomad=stack.nomad_target(), job="cacheS",
                                                                 poll_seconds=0.05, deadline_seconds=20,
                                                                 port_label="redis"))
    assert out.expected == len(eligible) == len(out.allocations)
    assert sorted(out.endpoints) == sorted(f"{a.ports['redis']}" for a in out.allocations)
    assert all(e.endswith(":16380") for e in out.endpoints)
    with pytest.raises(ApplicationError) as err:
        env.run(na.job_redeploy_from_scratch, na.RedeployInput(nomad=stack.nomad_target(), job="cacheS",
                                                               poll_seconds=0.05, deadline_seconds=20,
                                                               port_label="http"))
    assert err.value.non_retryable and "'http'" in str(err.value)
    n.job.deregister_job("cacheS", purge=True)


# --------------------------------------------------------------------------- vault


def test_vault_health_fields_and_sealed_is_an_error(stack):
    out = va.health(va.HealthInput(address=stack.vault.url))
    assert out.initialized and not out.sealed and not out.standby and out.version
    stack.vault.state.sealed = True
    try:
        with pytest.raises(ApplicationError) as err:
            va.health(va.HealthInput(address=stack.vault.url))
        assert err.value.type == "VaultSealed"
    finally:
        stack.vault.state.sealed = False
    with pytest.raises(ApplicationError):
        va.health(va.HealthInput(address="http://127.0.0.1:1"))


def test_vault_read_returns_a_reference_not_the_value(stack):
    out = va.read(va.ReadInput(address=stack.vault.url, path="coldstart/consul", token_file=stack.token_file,
                               require_keys=["token"]))
    assert out.keys == ["token"] and out.version >= 1 and out.refs["token"].field == "token"
    assert CONSUL_TOKEN not in json.dumps(out.model_dump(mode="json"))
    with pytest.raises(ApplicationError) as err:
        va.read(va.ReadInput(address=stack.vault.url, path="coldstart/nothing", token_file=stack.token_file))
    assert err.value.non_retryable and CONSUL_TOKEN not in str(err.value)
    with pytest.raises(ApplicationError) as err:
        va.read(va.ReadInput(address=stack.vault.url, path="coldstart/consul", token_file=stack.token_file,
                             require_keys=["password"]))
    assert err.value.non_retryable and CONSUL_TOKEN not in str(err.value)
