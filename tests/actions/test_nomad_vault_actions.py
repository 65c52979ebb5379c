"""Nomad and Vault actions through python-nomad and hvac, on the stand-ins and on real Nomad and Vault.

Real Nomad rolls every register or scale of a service or system job out with a deployment (10 s of
min_healthy_time by default) and refuses to scale while it runs; most jobs here have a 1 s
min_healthy_time to stay quick, one test keeps the default.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import textwrap
import time

import hvac
import nomad
import pytest
from nomad.api.exceptions import BadRequestNomadException
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import nomad as na
from activities import vault as va
from lab.hashistack.local import dev_unseal_key

from .conftest import CONSUL_TOKEN, VAULT_ROOT

NODES = ("cache1", "cache2", "cache3")
QUICK = {"MinHealthyTime": 1_000_000_000}  # 1 s: deployments finish soon after the tasks start


@pytest.fixture(scope="module")
def stack(stack):
    """The shared stack, with three Nomad client nodes on the real backend too (the stand-in has three)."""
    if stack.real:
        stack.local.add_nomad_clients(len(NODES))
    return stack


def job(name: str, count: int, *, update: dict | None = QUICK, command: str = "/bin/sh",
        args: list[str] | None = None, kill_timeout_s: float = 2, **group) -> dict:
    task = {"Name": "redis", "Driver": "raw_exec", "KillTimeout": int(kill_timeout_s * 1e9),
            "Config": {"command": command, "args": args or ["-c", "exec sleep 600"]}}
    tg = {"Name": "cache", "Count": count, "Tasks": [task], **group}
    if update is not None:
        tg["Update"] = update
    return {"ID": name, "Datacenters": ["dc1"], "TaskGroups": [tg]}


def deployment(n: nomad.Nomad, job_id: str) -> dict | None:
    return n.job.request(job_id, "deployment", method="get").json()


def wait_running(stack, n: nomad.Nomad, job_id: str, count: int, timeout: float = 30) -> None:
    stack.wait_until(lambda: sum(a["ClientStatus"] == "running" and a["DesiredStatus"] == "run"
                                 for a in n.job.get_allocations(job_id)) >= count, timeout=timeout)


def purge(n: nomad.Nomad, *job_ids: str) -> None:
    for job_id in job_ids:
        if job_id in n.job:
            n.job.deregister_job(job_id, purge=True)


def beats_env(beats: list) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *d: beats.append(d[0] if d else None)
    return env


# --------------------------------------------------------------------------- scale


def test_scale_waits_out_the_deployments_and_undo_restores(stack):
    """Default update block (min_healthy_time 10 s): a scale right after the register, and its undo
    right after the scale, each wait for the deployment before it instead of failing on Nomad's 400."""
    n = stack.nomad_api()
    n.job.register_job("sc1", {"Job": job("sc1", 3, update=None)})
    try:
        target = stack.nomad_target()
        dep = stack.wait_until(lambda: deployment(n, "sc1"))
        assert dep["Status"] == "running" and dep["TaskGroups"]["cache"]["DesiredTotal"] == 3
        with pytest.raises(BadRequestNomadException) as refused:  # what the action must not stumble on
            n.job.request("sc1", "scale", method="post", json={"Count": 1, "Target": {"Group": "cache"}})
        assert refused.value.nomad_resp.text.strip() == na.SCALE_BLOCKED
        beats: list = []
        out = beats_env(beats).run(na.jobs_scale, na.ScaleInput(nomad=target, job="sc1", count=1))
        assert out.changed and out.previous_count == 3 and out.group == "cache"
        assert any(isinstance(b, dict) and b.get("waiting_for_deployment") == dep["ID"] for b in beats)
        assert n.job.get_job("sc1")["TaskGroups"][0]["Count"] == 1
        scaled = stack.wait_until(lambda: (d := deployment(n, "sc1"))["ID"] != dep["ID"] and d)  # the scale's own
        assert scaled["Status"] == "running" and scaled["JobVersion"] == 1
        assert not na.jobs_scale(na.ScaleInput(nomad=target, job="sc1", count=1)).changed  # no wait for a no-op
        back = beats_env(beats).run(na.jobs_scale, out.undo)
        assert back.changed and back.previous_count == 1 and n.job.get_job("sc1")["TaskGroups"][0]["Count"] == 3
        assert n.deployment.get_deployment(scaled["ID"])["Status"] == "successful"
        with pytest.raises(ApplicationError) as err:
            na.jobs_scale(na.ScaleInput(nomad=target, job="sc1", group="nope", count=1))
        assert err.value.non_retryable
        with pytest.raises(ApplicationError) as err:
            na.jobs_scale(na.ScaleInput(nomad=target, job="missing", count=1))
        assert err.value.non_retryable and err.value.type == "NotFound"
    finally:
        purge(n, "sc1")


def test_scale_refuses_a_deployment_that_needs_an_operator(stack):
    """A paused deployment never ends by itself: an error at once, not a ten-minute wait."""
    n = stack.nomad_api()
    n.job.register_job("sc2", {"Job": job("sc2", 1, update={"MinHealthyTime": 60_000_000_000})})
    try:
        dep = stack.wait_until(lambda: deployment(n, "sc2"))
        n.deployment.pause_deployment(dep["ID"], True)
        target = stack.nomad_target()
        with pytest.raises(ApplicationError) as err:
            na.jobs_scale(na.ScaleInput(nomad=target, job="sc2", count=2))
        assert err.value.non_retryable and "is paused" in str(err.value) and dep["ID"][:8] in str(err.value)
        assert n.job.get_job("sc2")["TaskGroups"][0]["Count"] == 1
        n.deployment.fail_deployment(dep["ID"])  # what an operator may do; a failed one no longer blocks
        assert na.jobs_scale(na.ScaleInput(nomad=target, job="sc2", count=2)).changed
    finally:
        purge(n, "sc2")


def test_update_job_waits_for_the_deployment_and_reads_back(stack):
    n = stack.nomad_api()
    n.job.register_job("up1", {"Job": job("up1", 1)})
    try:
        def tag(spec: dict) -> bool:
            if (spec.get("Meta") or {}).get("coldstart") == "drill":
                return False
            spec["Meta"] = {**(spec.get("Meta") or {}), "coldstart": "drill"}
            return True

        before, changed = na.update_job(n, "up1", "default", tag)  # right after the register
        assert changed and before["Version"] == 0
        now = n.job.get_job("up1")
        assert now["Meta"] == {"coldstart": "drill"} and now["Version"] == 1
        assert na.update_job(n, "up1", "default", tag)[1] is False
        assert n.job.get_job("up1")["JobModifyIndex"] == now["JobModifyIndex"]
        assert na.wait_for_no_active_deployment(n, "never-registered") is False  # Nomad answers null
    finally:
        purge(n, "up1")


# --------------------------------------------------------------------------- node quarantine


def test_quarantine_ready_node_failing_allocations_and_undo(stack):
    """cache2 is ready and eligible, but the job's allocation there fails (its task exits 1 on that node)."""
    n = stack.nomad_api()
    spec = job("spread", 3, args=["-c", 'test "${node.unique.name}" != cache2 && exec sleep 600'],
               Constraints=[{"Operand": "distinct_hosts", "RTarget": "true"}],
               RestartPolicy={"Attempts": 0, "Mode": "fail", "Interval": 60_000_000_000, "Delay": 1_000_000_000},
               ReschedulePolicy={"Delay": 3600_000_000_000, "DelayFunction": "constant", "Unlimited": True})
    n.job.register_job("spread", {"Job": spec})
    try:
        stack.wait_until(lambda: sorted((a["NodeName"], a["ClientStatus"]) for a in n.job.get_allocations("spread"))
                         == [("cache1", "running"), ("cache2", "failed"), ("cache3", "running")], timeout=30)
        target = stack.nomad_target()
        inp = na.QuarantineInput(nomad=target, failed_allocs_within_minutes=10)
        out = na.nodes_quarantine_unhealthy(inp)
        assert [v.name for v in out.quarantined] == ["cache2"] and "failed" in out.quarantined[0].reasons[0]
        assert sorted(out.healthy) == ["cache1", "cache3"] and out.skipped == []
        node = next(x for x in n.nodes.get_nodes() if x["Name"] == "cache2")
        assert node["SchedulingEligibility"] == "ineligible" and node["Status"] == "ready"
        assert out.undo.node_ids == [node["ID"]]
        again = na.nodes_quarantine_unhealthy(inp)
        assert again.quarantined == [] and again.skipped == ["cache2"] and again.undo.node_ids == []
        undo = na.nodes_restore_eligibility(out.undo)
        assert undo.made_eligible == ["cache2"]
        assert na.nodes_restore_eligibility(out.undo).unchanged == ["cache2"]
        with pytest.raises(ApplicationError) as err:  # a probe failing everywhere is refused
            na.nodes_quarantine_unhealthy(na.QuarantineInput(nomad=target, probes=[
                na.NodeProbe(node=name, url="http://127.0.0.1:1/") for name in NODES]))
        assert err.value.non_retryable and err.value.type == "TooMany"
        assert all(x["SchedulingEligibility"] == "eligible" for x in n.nodes.get_nodes())
    finally:
        for x in n.nodes.get_nodes():
            if x["SchedulingEligibility"] != "eligible":
                n.node.eligible_node(x["ID"], eligible=True)
        purge(n, "spread")


# --------------------------------------------------------------------------- redeploy from scratch


def test_redeploy_from_scratch_records_spec_and_waits_for_the_deployment(stack):
    n = stack.nomad_api()
    n.job.register_job("cacheA", {"Job": job("cacheA", 2)})
    try:
        wait_running(stack, n, "cacheA", 2)
        old = {a["ID"] for a in n.job.get_allocations("cacheA")}
        beats: list = []
        out = beats_env(beats).run(na.job_redeploy_from_scratch, na.RedeployInput(
            nomad=stack.nomad_target(), job="cacheA", poll_seconds=0.05, deadline_seconds=30))
        assert out.spec_source == "recorded" and out.purged and out.expected == 2
        assert len(out.allocations) == 2 and not ({a.id for a in out.allocations} & old)
        assert any(isinstance(b, dict) and b.get("phase") == "wait" for b in beats)
        assert n.job.get_job("cacheA")["Version"] == 0  # purged: a fresh job, not version 1
        # Returned only once the new registration's deployment succeeded, every allocation healthy.
        dep = deployment(n, "cacheA")
        assert dep["Status"] == "successful" and dep["JobVersion"] == 0
        assert all(n.allocation.get_allocation(a.id)["DeploymentStatus"]["Healthy"] for a in out.allocations)
    finally:
        purge(n, "cacheA")


STUBBORN = textwrap.dedent("""\
    import os, signal, sys, time
    here = sys.argv[1]
    for name in os.listdir(here):
        if name.endswith(".pid"):
            try:
                os.kill(int(open(os.path.join(here, name)).read()), 0)
            except (OSError, ValueError):
                continue
            open(os.path.join(here, "overlap"), "a").write(name + "\\n")
    with open(os.path.join(here, os.environ["NOMAD_ALLOC_ID"] + ".pid"), "w") as f:
        f.write(str(os.getpid()))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        time.sleep(0.2)
""")


def test_redeploy_waits_until_old_tasks_are_gone(stack, tmp_path):
    """A task ignoring its kill signal runs until kill_timeout; the new one must not start beside it."""
    here = tmp_path / "stubborn"
    here.mkdir()
    (here / "task.py").write_text(STUBBORN)
    spec = job("cacheT", 1, command=sys.executable, args=[str(here / "task.py"), str(here)], kill_timeout_s=3)
    n = stack.nomad_api()
    n.job.register_job("cacheT", {"Job": spec})
    try:
        wait_running(stack, n, "cacheT", 1)
        stack.wait_until(lambda: list(here.glob("*.pid")))
        [old] = [int(p.read_text()) for p in here.glob("*.pid")]
        out = ActivityEnvironment().run(na.job_redeploy_from_scratch, na.RedeployInput(
            nomad=stack.nomad_target(), job="cacheT", poll_seconds=0.05, deadline_seconds=30))
        assert out.purged and len(out.allocations) == 1 and out.stop_seconds >= 2.5  # the kill timeout
        with pytest.raises(ProcessLookupError):
            os.kill(old, 0)
        assert len(list(here.glob("*.pid"))) == 2 and not (here / "overlap").exists()
    finally:
        purge(n, "cacheT")


def test_redeploy_resumes_after_a_crash_at_each_step(stack):
    n = stack.nomad_api()
    target = stack.nomad_target()
    # Crashed between purge and register: the recorded spec is registered.
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_details=[
        {"job": "cacheB", "phase": "register", "spec": na._clean(job("cacheB", 1)), "source": "recorded",
         "t0": time.time(), "purged": True}])
    try:
        out = env.run(na.job_redeploy_from_scratch, na.RedeployInput(nomad=target, job="cacheB", poll_seconds=0.05,
                                                                     deadline_seconds=30))
        assert out.spec_source == "recorded" and out.purged and len(out.allocations) == 1
        # Crashed between stop and purge: not stopped again; waited for, purged, registered afresh.
        n.job.register_job("cacheC", {"Job": job("cacheC", 1)})
        wait_running(stack, n, "cacheC", 1)
        recorded = na._clean(n.job.get_job("cacheC"))
        n.job.deregister_job("cacheC")
        env.info = dataclasses.replace(env.info, heartbeat_details=[
            {"job": "cacheC", "phase": "stop", "spec": recorded, "source": "recorded", "t0": time.time()}])
        out = env.run(na.job_redeploy_from_scratch, na.RedeployInput(nomad=target, job="cacheC", poll_seconds=0.05,
                                                                     deadline_seconds=30))
        assert out.purged and len(out.allocations) == 1
        now = n.job.get_job("cacheC")
        assert now["Version"] == 0 and now["Stop"] is False
        with pytest.raises(ApplicationError) as err:
            na.job_redeploy_from_scratch(na.RedeployInput(nomad=target, job="never-existed"))
        assert err.value.non_retryable
    finally:
        purge(n, "cacheB", "cacheC")


def test_redeploy_system_job_expects_eligible_nodes_and_returns_endpoints(stack):
    n = stack.nomad_api()
    spec = job("cacheS", 1)
    spec.update(Type="system")
    spec["TaskGroups"][0]["Networks"] = [{"ReservedPorts": [{"Label": "redis", "Value": 16380}]}]
    n.job.register_job("cacheS", {"Job": spec})
    try:
        eligible = [x for x in n.nodes.get_nodes() if x["SchedulingEligibility"] == "eligible" and x["Status"] == "ready"]
        assert len(eligible) == len(NODES)
        wait_running(stack, n, "cacheS", len(eligible))
        env = ActivityEnvironment()
        out = env.run(na.job_redeploy_from_scratch, na.RedeployInput(nomad=stack.nomad_target(), job="cacheS",
                                                                     poll_seconds=0.05, deadline_seconds=30,
                                                                     port_label="redis"))
        assert out.expected == len(eligible) == len(out.allocations)
        assert sorted(a.node for a in out.allocations) == sorted(NODES)
        assert sorted(out.endpoints) == sorted(f"{a.ports['redis']}" for a in out.allocations)
        assert all(e.endswith(":16380") and not e.startswith("?") for e in out.endpoints)
        dep = deployment(n, "cacheS")  # Nomad deploys system jobs too: it succeeded before the return
        assert dep["Status"] == "successful" and dep["TaskGroups"]["cache"]["HealthyAllocs"] == len(eligible)
        with pytest.raises(ApplicationError) as err:
            env.run(na.job_redeploy_from_scratch, na.RedeployInput(nomad=stack.nomad_target(), job="cacheS",
                                                                   poll_seconds=0.05, deadline_seconds=30,
                                                                   port_label="http"))
        assert err.value.non_retryable and "'http'" in str(err.value)
    finally:
        purge(n, "cacheS")


# --------------------------------------------------------------------------- vault


def unseal_key(stack) -> str:
    """The dev server's single unseal key, as it printed it at start (Vault is real on both backends)."""
    return dev_unseal_key(stack.vault_log)


def test_vault_health_fields_and_sealed_is_an_error(stack):
    out = va.health(va.HealthInput(address=stack.vault_url))
    assert out.initialized and not out.sealed and not out.standby and out.version
    root = hvac.Client(url=stack.vault_url, token=VAULT_ROOT)
    key = unseal_key(stack)
    root.sys.seal()
    try:
        with pytest.raises(ApplicationError) as err:
            va.health(va.HealthInput(address=stack.vault_url))
        assert err.value.type == "VaultSealed" and not err.value.non_retryable
        assert err.value.details[0]["sealed"] is True
    finally:
        root.sys.submit_unseal_key(key=key)
    assert not va.health(va.HealthInput(address=stack.vault_url)).sealed
    with pytest.raises(ApplicationError):
        va.health(va.HealthInput(address="http://127.0.0.1:1"))


def test_vault_read_returns_a_reference_not_the_value(stack):
    out = va.read(va.ReadInput(address=stack.vault_url, path="coldstart/consul", token_file=stack.token_file,
                               require_keys=["token"]))
    assert out.keys == ["token"] and out.version >= 1 and out.refs["token"].field == "token"
    assert CONSUL_TOKEN not in json.dumps(out.model_dump(mode="json"))
    with pytest.raises(ApplicationError) as err:
        va.read(va.ReadInput(address=stack.vault_url, path="coldstart/nothing", token_file=stack.token_file))
    assert err.value.non_retryable and err.value.type == "VaultMissing" and CONSUL_TOKEN not in str(err.value)
    with pytest.raises(ApplicationError) as err:
        va.read(va.ReadInput(address=stack.vault_url, path="coldstart/consul", token_file=stack.token_file,
                             require_keys=["password"]))
    assert err.value.non_retryable and CONSUL_TOKEN not in str(err.value)
