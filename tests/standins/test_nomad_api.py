"""Nomad stand-in exercised through python-nomad: jobs, evals, allocs, nodes, scheduler, raw_exec, metrics."""

from __future__ import annotations

import os
from pathlib import Path

import nomad
import pytest
import requests
from nomad.api.exceptions import BaseNomadException, URLNotFoundNomadException
from prometheus_client.parser import text_string_to_metric_families

from .conftest import start_nomad, wait_until


def job_spec(job_id: str, count: int, command: str = "/bin/sleep", args=("300",), reschedule_delay_s: int = 5,
             update: dict | None = None):
    group = {
        "Name": "cache", "Count": count,
        "ReschedulePolicy": {"Delay": reschedule_delay_s * 10**9, "DelayFunction": "constant", "Unlimited": True},
        "Tasks": [{"Name": "redis", "Driver": "raw_exec",
                   "Config": {"command": command, "args": list(args)}, "KillTimeout": 2 * 10**9}],
    }
    if update is not None:
        group["Update"] = update
    return {"Job": {"ID": job_id, "Name": job_id, "Type": "service", "Datacenters": ["dc1"], "TaskGroups": [group]}}


QUICK = {"MinHealthyTime": 200_000_000}  # 0.2 s: deployments finish fast


def deployment(n: nomad.Nomad, job_id: str) -> dict | None:
    return n.job.request(job_id, "deployment", method="get").json()


def settled(n: nomad.Nomad, job_id: str, status: str = "successful") -> dict:
    return wait_until(lambda: (d := deployment(n, job_id)) and d["Status"] == status and d)


def client(lab) -> nomad.Nomad:
    return nomad.Nomad(host="127.0.0.1", port=lab.port, timeout=10)


def statuses(n: nomad.Nomad, job_id: str) -> list[tuple[str, str, str]]:
    return sorted((a["NodeName"], a["ClientStatus"], a["DesiredStatus"]) for a in n.job.get_allocations(job_id))


def node_id(n: nomad.Nomad, name: str) -> str:
    return next(x["ID"] for x in n.nodes.get_nodes() if x["Name"] == name)


def prom(n: nomad.Nomad) -> dict:
    text = n.metrics.request(method="get", params={"format": "prometheus"}).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_register_spreads_and_runs_real_processes(nomad_lab, tmp_path):
    n = client(nomad_lab)
    spec = job_spec("cache", 3, "/bin/sh", ["-c", f"echo $$ > {tmp_path}/$NOMAD_ALLOC_ID.pid; exec sleep 300"])
    resp = n.jobs.register_job(spec)
    assert resp["EvalID"] and resp["JobModifyIndex"] > 0
    ev = n.evaluation.get_evaluation(resp["EvalID"])
    assert ev["Status"] == "complete" and ev["TriggeredBy"] == "job-register" and ev["JobID"] == "cache"
    assert any(e["ID"] == resp["EvalID"] for e in n.evaluations.get_evaluations())
    wait_until(lambda: [s[1] for s in statuses(n, "cache")] == ["running"] * 3)
    assert [s[0] for s in statuses(n, "cache")] == ["cache1", "cache2", "cache3"]  # spread
    job = n.job.get_job("cache")
    assert job["Status"] == "running" and job["Version"] == 0
    assert [j["ID"] for j in n.jobs.get_jobs()] == ["cache"]
    summary = n.job.get_summary("cache")["Summary"]["cache"]
    assert summary["Running"] == 3 and summary["Queued"] == 0
    alloc = n.allocation.get_allocation(n.job.get_allocations("cache")[0]["ID"])
    assert alloc["Job"]["ID"] == "cache" and alloc["TaskStates"]["redis"]["State"] == "running"
    assert len(n.allocations.get_allocations()) == 3
    assert len(n.evaluation.get_allocations(resp["EvalID"])) == 3
    pids = wait_until(lambda: [int(p.read_text()) for p in tmp_path.glob("*.pid")] if len(list(tmp_path.glob("*.pid"))) == 3 else None)
    for pid in pids:
        os.kill(pid, 0)  # really running
    stop = n.job.deregister_job("cache")  # no purge: job stays, stopped
    assert n.evaluation.get_evaluation(stop["EvalID"])["TriggeredBy"] == "job-deregister"
    wait_until(lambda: {s[1] for s in statuses(n, "cache")} == {"complete"})
    assert {s[2] for s in statuses(n, "cache")} == {"stop"}
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    job = n.job.get_job("cache")
    assert job["Stop"] is True and job["Status"] == "dead" and job["Version"] == 1
    n.job.deregister_job("cache", purge=True)
    with pytest.raises(URLNotFoundNomadException):
        n.job.get_job("cache")
    assert "cache" not in n.job


def test_versions_and_enforce_index_check_and_set(nomad_lab):
    n = client(nomad_lab)
    first = n.jobs.register_job(job_spec("web", 1))
    jmi = first["JobModifyIndex"]
    with pytest.raises(BaseNomadException) as exc:
        n.jobs.register_job(dict(job_spec("web", 2), EnforceIndex=True, JobModifyIndex=0))
    assert "Enforcing job modify index 0: job already exists" in exc.value.nomad_resp.text
    with pytest.raises(BaseNomadException) as exc:
        n.jobs.register_job(dict(job_spec("web", 2), EnforceIndex=True, JobModifyIndex=jmi + 999))
    assert "conflicting job modify index" in exc.value.nomad_resp.text
    with pytest.raises(BaseNomadException):
        n.jobs.register_job(dict(job_spec("other", 1), EnforceIndex=True, JobModifyIndex=5))
    ok = n.job.register_job("web", dict(job_spec("web", 2), EnforceIndex=True, JobModifyIndex=jmi))
    assert ok["JobModifyIndex"] > jmi
    same = n.jobs.register_job(job_spec("web", 2))  # unchanged spec: no new version
    assert same["JobModifyIndex"] == ok["JobModifyIndex"]
    versions = n.job.get_versions("web")["Versions"]
    assert [v["Version"] for v in versions] == [1, 0]
    assert versions[0]["TaskGroups"][0]["Count"] == 2
    with pytest.raises(BaseNomadException):
        n.job.register_job("mismatch", job_spec("web", 1))
    n.job.deregister_job("web", purge=True)


def test_scale_creates_version_and_evaluation(nomad_lab):
    n = client(nomad_lab)
    n.jobs.register_job(job_spec("svc", 1, update=QUICK))
    wait_until(lambda: [s[1] for s in statuses(n, "svc")] == ["running"])
    settled(n, "svc")
    resp = n.job.request("svc", "scale", method="post",
                         json={"Count": 3, "Target": {"Group": "cache"}, "Message": "drill"}).json()
    ev = n.evaluation.get_evaluation(resp["EvalID"])
    assert ev["TriggeredBy"] == "job-scaling"
    wait_until(lambda: [s[1] for s in statuses(n, "svc")] == ["running"] * 3)
    assert n.job.get_job("svc")["Version"] == 1
    assert n.job.request("svc", "scale", method="get").json()["TaskGroups"]["cache"]["Desired"] == 3
    settled(n, "svc")
    n.job.request("svc", "scale", method="post", json={"Count": 1, "Target": {"Group": "cache"}})
    wait_until(lambda: sum(1 for s in statuses(n, "svc") if s[1] == "running") == 1)
    with pytest.raises(BaseNomadException):
        n.job.request("svc", "scale", method="post", json={"Count": 1, "Target": {"Group": "nope"}})
    ids = [e["ID"] for e in n.job.get_evaluations("svc")]
    assert len(ids) >= 3
    n.job.deregister_job("svc", purge=True)


def test_eligibility_and_drain(nomad_lab):
    n = client(nomad_lab)
    c1 = node_id(n, "cache1")
    node = n.node.get_node(c1)
    assert node["Status"] == "ready" and node["SchedulingEligibility"] == "eligible"
    assert n.node.eligible_node(c1, ineligible=True)["NodeModifyIndex"] > 0
    assert n.node.get_node(c1)["SchedulingEligibility"] == "ineligible"
    n.jobs.register_job(job_spec("elig", 2))
    wait_until(lambda: [s[1] for s in statuses(n, "elig")] == ["running"] * 2)
    assert "cache1" not in {s[0] for s in statuses(n, "elig")}
    n.node.eligible_node(c1, eligible=True)
    c2 = node_id(n, "cache2")
    resp = n.node.drain_node_with_spec(c2, {"Deadline": 60 * 10**9, "IgnoreSystemJobs": False})
    assert resp["EvalIDs"]
    wait_until(lambda: "cache2" not in {s[0] for s in statuses(n, "elig") if s[1] == "running"}
               and sum(1 for s in statuses(n, "elig") if s[1] == "running") == 2)
    drained = n.node.get_node(c2)
    assert drained["SchedulingEligibility"] == "ineligible" and drained["LastDrain"]["Status"] == "complete"
    n.node.drain_node_with_spec(c2, None, mark_eligible=True)
    assert n.node.get_node(c2)["SchedulingEligibility"] == "eligible"
    with pytest.raises(BaseNomadException):
        n.node.drain_node(c2, enable=True)  # no body: Nomad rejects it too
    with pytest.raises(URLNotFoundNomadException):
        n.node.get_node("00000000-dead-beef-0000-000000000000")
    n.job.deregister_job("elig", purge=True)


def test_unhealthy_eligible_node_attracts_and_fails_allocs(nomad_lab):
    n = client(nomad_lab)
    requests.post(f"{nomad_lab.url}/_lab/faults", json={"fault": "unhealthy-node-eligible", "node": "cache3"},
                  timeout=10).raise_for_status()
    # progress_deadline 0: the first unhealthy allocation fails the deployment (which would block scaling).
    n.jobs.register_job(job_spec("game", 3, reschedule_delay_s=5, update={"ProgressDeadline": 0}))
    wait_until(lambda: statuses(n, "game") == [("cache1", "running", "run"), ("cache2", "running", "run"),
                                                 ("cache3", "failed", "run")])
    bad = next(a for a in n.job.get_allocations("game") if a["NodeName"] == "cache3")
    assert bad["TaskStates"]["redis"]["Failed"] is True
    assert bad["FollowupEvalID"]
    fams = prom(n)
    failed = {s.labels["host"]: (s.value, s.labels["node_scheduling_eligibility"], s.labels["node_status"])
              for s in fams["nomad_client_allocations_failed"].samples}
    assert failed["cache3"] == (1.0, "eligible", "ready")
    running = {s.labels["host"]: s.value for s in fams["nomad_client_allocations_running"].samples}
    assert running == {"cache1": 1.0, "cache2": 1.0, "cache3": 0.0}
    js = {s.labels["task_group"]: s.value for s in fams["nomad_nomad_job_summary_failed"].samples
          if s.labels["job"] == "game"}
    assert js == {"cache": 1.0}
    assert "nomad_nomad_job_summary_queued" in fams and "nomad_nomad_job_summary_running" in fams
    # The failed allocation fails the job's deployment, which no longer blocks scaling.
    assert settled(n, "game", "failed")["StatusDescription"] == "Failed due to unhealthy allocations"
    # Scaling up: the empty unhealthy node is the least loaded, so it gets the placement.
    n.job.request("game", "scale", method="post", json={"Count": 4, "Target": {"Group": "cache"}})
    wait_until(lambda: sum(1 for s in statuses(n, "game") if s == ("cache3", "failed", "run")) == 2)
    # Runbook step: mark the bad node ineligible; reschedules then land elsewhere.
    n.node.eligible_node(node_id(n, "cache3"), ineligible=True)
    nomad_lab.clock.advance(6)
    wait_until(lambda: sum(1 for s in statuses(n, "game") if s[1] == "running") == 4, timeout=10)
    assert all(s[0] != "cache3" for s in statuses(n, "game") if s[1] == "running")
    requests.delete(f"{nomad_lab.url}/_lab/faults", timeout=10).raise_for_status()
    n.job.deregister_job("game", purge=True)


def test_task_exit_marks_alloc_failed(nomad_lab):
    n = client(nomad_lab)
    n.jobs.register_job(job_spec("crash", 1, "/bin/sh", ["-c", "exit 3"], reschedule_delay_s=3600))
    wait_until(lambda: [s[1] for s in statuses(n, "crash")] == ["failed"])
    alloc = n.allocation.get_allocation(n.job.get_allocations("crash")[0]["ID"])
    event = alloc["TaskStates"]["redis"]["Events"][-1]
    assert event["ExitCode"] == 3 and alloc["TaskStates"]["redis"]["State"] == "dead"
    n.jobs.register_job(job_spec("missing", 1, "/definitely/not/here"))
    wait_until(lambda: [s[1] for s in statuses(n, "missing")] == ["failed"])
    for job in ("crash", "missing"):
        n.job.deregister_job(job, purge=True)


def test_state_dir_keeps_jobs_across_restart(tmp_path):
    from lab.standins.clock import FakeClock

    lab = start_nomad(FakeClock(), tmp_path)
    try:
        n = client(lab)
        n.jobs.register_job(job_spec("durable", 1))
        wait_until(lambda: [s[1] for s in statuses(n, "durable")] == ["running"])
    finally:
        lab.server.stop()
    assert (tmp_path / "nomad-state.json").exists()
    lab2 = start_nomad(FakeClock(), tmp_path)
    try:
        n = client(lab2)
        assert n.job.get_job("durable")["ID"] == "durable"
        wait_until(lambda: [s[1] for s in statuses(n, "durable")] == ["running"])  # task restarted
        n.job.deregister_job("durable", purge=True)
    finally:
        lab2.server.stop()


def test_system_job_one_per_eligible_node_with_static_ports(nomad_lab):
    n = client(nomad_lab)
    spec = job_spec("sys", 1)
    spec["Job"]["Type"] = "system"
    spec["Job"]["TaskGroups"][0]["Networks"] = [{"ReservedPorts": [{"Label": "redis", "Value": 16379}]}]
    n.node.eligible_node(node_id(n, "cache3"), ineligible=True)
    try:
        n.jobs.register_job(spec)
        wait_until(lambda: [s[1] for s in statuses(n, "sys")] == ["running"] * 2)
        assert [s[0] for s in statuses(n, "sys")] == ["cache1", "cache2"]  # nothing new on the ineligible node
        stub = n.job.get_allocations("sys")[0]
        assert "AllocatedResources" not in stub  # a list entry: read the allocation for its resources
        ports = n.allocation.get_allocation(stub["ID"])["AllocatedResources"]["Shared"]["Ports"]
        assert [(p["Label"], p["Value"]) for p in ports] == [("redis", 16379)] and ports[0]["HostIP"]
        # Eligible again: a node-update evaluation places the missing allocation there.
        resp = n.node.eligible_node(node_id(n, "cache3"), eligible=True)
        assert resp["EvalIDs"]
        wait_until(lambda: [s[0] for s in statuses(n, "sys") if s[1] == "running"] == ["cache1", "cache2", "cache3"])
        # A service job asking for the same static port finds no node with it free: nothing is placed.
        other = job_spec("svc-port", 1)
        other["Job"]["TaskGroups"][0]["Networks"] = [{"ReservedPorts": [{"Label": "redis", "Value": 16379}]}]
        n.jobs.register_job(other)
        assert n.job.get_summary("svc-port")["Summary"]["cache"]["Queued"] == 1
        assert statuses(n, "svc-port") == []
    finally:
        n.node.eligible_node(node_id(n, "cache3"), eligible=True)
        for job_id in ("sys", "svc-port"):
            n.job.deregister_job(job_id, purge=True)


def test_deployments_as_nomad_runs_them(nomad_lab):
    """Checked against Nomad 2.0: which changes start a deployment, what blocks, how it ends."""
    n = client(nomad_lab)
    n.jobs.register_job(job_spec("dep", 2, update={"MinHealthyTime": 500_000_000}))
    job = n.job.get_job("dep")
    assert job["TaskGroups"][0]["Update"]["MaxParallel"] == 1 and job["TaskGroups"][0]["Update"]["HealthCheck"] == "checks"
    first = wait_until(lambda: deployment(n, "dep"))
    assert first["Status"] == "running" and first["StatusDescription"] == "Deployment is running"
    assert first["JobVersion"] == 0 and first["JobCreateIndex"] == job["CreateIndex"]
    assert first["TaskGroups"]["cache"]["DesiredTotal"] == 2 and first["TaskGroups"]["cache"]["PlacedAllocs"] == 2
    assert all(a["DeploymentStatus"] is None for a in n.job.get_allocations("dep"))  # health not known yet
    with pytest.raises(BaseNomadException) as exc:
        n.job.request("dep", "scale", method="post", json={"Count": 1, "Target": {"Group": "cache"}})
    assert exc.value.nomad_resp.status_code == 400
    assert exc.value.nomad_resp.text == "job scaling blocked due to active deployment"
    done = settled(n, "dep")
    assert done["StatusDescription"] == "Deployment completed successfully"
    assert done["TaskGroups"]["cache"]["HealthyAllocs"] == 2 and n.job.get_job("dep")["Stable"] is True
    assert all(a["DeploymentStatus"]["Healthy"] is True for a in n.job.get_allocations("dep"))
    n.jobs.register_job(job_spec("dep", 2, update={"MinHealthyTime": 500_000_000}))  # unchanged: no deployment
    assert deployment(n, "dep")["ID"] == first["ID"]
    # A scale is a new version: the allocation kept is updated in place and joins a new deployment.
    n.job.request("dep", "scale", method="post", json={"Count": 1, "Target": {"Group": "cache"}})
    scaled = deployment(n, "dep")
    assert scaled["ID"] != first["ID"] and scaled["JobVersion"] == 1
    assert scaled["TaskGroups"]["cache"]["DesiredTotal"] == 1 and scaled["TaskGroups"]["cache"]["PlacedAllocs"] == 1
    settled(n, "dep")
    n.job.request("dep", "scale", method="post", json={"Count": 0, "Target": {"Group": "cache"}})
    assert deployment(n, "dep")["JobVersion"] == 1  # nothing to deploy at count 0
    n.job.request("dep", "scale", method="post", json={"Count": 2, "Target": {"Group": "cache"}})
    running = deployment(n, "dep")
    assert running["Status"] == "running" and running["JobVersion"] == 3
    # A newer version cancels the running deployment; so does stopping the job.
    n.jobs.register_job(job_spec("dep", 2, args=("301",), update={"MinHealthyTime": 500_000_000}))
    assert n.deployment.get_deployment(running["ID"])["StatusDescription"] == "Cancelled due to newer version of job"
    newer = deployment(n, "dep")
    n.job.deregister_job("dep")
    stopped = n.deployment.get_deployment(newer["ID"])
    assert (stopped["Status"], stopped["StatusDescription"]) == ("cancelled", "Cancelled because job is stopped")
    assert [d["ID"] for d in n.job.request("dep", "deployments", method="get").json()][:2] == [newer["ID"], running["ID"]]
    n.job.deregister_job("dep", purge=True)
    assert deployment(n, "dep") is None and n.job.request("dep", "deployments", method="get").json() == []
    with pytest.raises(URLNotFoundNomadException):
        n.deployment.get_deployment(newer["ID"])
    batch = job_spec("once", 1)
    batch["Job"]["Type"] = "batch"
    n.jobs.register_job(batch)
    assert n.job.get_job("once")["TaskGroups"][0]["Update"] is None and deployment(n, "once") is None
    n.job.deregister_job("once", purge=True)


def test_rolling_update_replaces_max_parallel_at_a_time_and_a_failure_fails_it(nomad_lab):
    n = client(nomad_lab)
    quick = {"MinHealthyTime": 300_000_000, "MaxParallel": 1}
    n.jobs.register_job(job_spec("roll", 3, update=quick))
    settled(n, "roll")
    n.jobs.register_job(job_spec("roll", 3, args=("301",), update=quick))
    dep = wait_until(lambda: (d := deployment(n, "roll")) and d["JobVersion"] == 1 and d)
    live = [a for a in n.job.get_allocations("roll") if a["DesiredStatus"] == "run"]
    assert sorted(a["JobVersion"] for a in live) == [0, 0, 1]  # one replaced, two old ones still serve
    seen = set()

    def progress():
        versions = tuple(sorted(a["JobVersion"] for a in n.job.get_allocations("roll") if a["DesiredStatus"] == "run"))
        seen.add(versions)
        return n.deployment.get_deployment(dep["ID"])["Status"] == "successful"

    wait_until(progress)
    assert (0, 1, 1) in seen and all(v.count(0) + v.count(1) == 3 for v in seen)
    assert sorted(a["JobVersion"] for a in n.job.get_allocations("roll") if a["DesiredStatus"] == "run") == [1, 1, 1]
    # A task that exits makes its allocation unhealthy: no more replacements; the deployment goes on until
    # its progress deadline (a reschedule may still make progress), and fails then.
    failing = {**quick, "HealthyDeadline": 1_000_000_000, "ProgressDeadline": 2_000_000_000}
    n.jobs.register_job(job_spec("roll", 3, "/bin/sh", ["-c", "exit 1"], reschedule_delay_s=3600, update=failing))
    wait_until(lambda: deployment(n, "roll")["TaskGroups"]["cache"]["UnhealthyAllocs"] == 1)
    assert deployment(n, "roll")["Status"] == "running"
    with pytest.raises(BaseNomadException):  # still blocks scaling
        n.job.request("roll", "scale", method="post", json={"Count": 2, "Target": {"Group": "cache"}})
    failed = settled(n, "roll", "failed")
    assert failed["StatusDescription"] == "Failed due to progress deadline" and failed["JobVersion"] == 2
    assert sorted(a["JobVersion"] for a in n.job.get_allocations("roll") if a["ClientStatus"] == "running") == [1, 1]
    n.job.request("roll", "scale", method="post", json={"Count": 2, "Target": {"Group": "cache"}})  # not blocked
    # progress_deadline 0: the first unhealthy allocation fails the deployment at once.
    n.jobs.register_job(job_spec("roll", 2, "/bin/sh", ["-c", "exit 2"], reschedule_delay_s=3600,
                                 update={**quick, "ProgressDeadline": 0}))
    assert settled(n, "roll", "failed")["StatusDescription"] == "Failed due to unhealthy allocations"
    n.job.deregister_job("roll", purge=True)


IGNORES_SIGNALS = ("import os, signal, sys, time\n"
                   "for s in (signal.SIGINT, signal.SIGTERM): signal.signal(s, lambda n, f: open(sys.argv[1], 'a')"
                   ".write(f'{n}\\n'))\n"
                   "open(sys.argv[1] + '.pid', 'w').write(str(os.getpid()))\n"
                   "while True: time.sleep(0.05)\n")


def test_stop_waits_for_the_kill_timeout_and_purge_forgets_at_once(nomad_lab, tmp_path):
    """As Nomad: the kill signal is SIGINT; a stopped allocation stays running until its task is gone,
    while a purge drops the allocations from the API at once and the task still gets its kill timeout."""
    import sys
    import time

    n = client(nomad_lab)
    script = tmp_path / "ignore.py"
    script.write_text(IGNORES_SIGNALS)
    for job_id, purge in (("stopped", False), ("purged", True)):
        log = tmp_path / job_id
        n.jobs.register_job(job_spec(job_id, 1, sys.executable, [str(script), str(log)]))
        pid = wait_until(lambda: (p := tmp_path / f"{job_id}.pid").exists() and p.read_text() and int(p.read_text()))
        started = time.monotonic()
        n.job.deregister_job(job_id, purge=purge)
        if purge:
            assert n.job.get_allocations(job_id) == [] and n.allocations.get_allocations() == []
        else:
            assert [(a["ClientStatus"], a["DesiredStatus"]) for a in n.job.get_allocations(job_id)] == [("running", "stop")]
        wait_until(lambda: log.exists() and log.read_text() == "2\n")  # SIGINT
        os.kill(pid, 0)  # still there: it ignores the signal
        wait_until(lambda: _gone_or_zombie(pid))
        assert time.monotonic() - started >= 1.5  # the 2 s kill timeout, then SIGKILL
        if not purge:
            wait_until(lambda: [a["ClientStatus"] for a in n.job.get_allocations(job_id)] == ["complete"])
            n.job.deregister_job(job_id, purge=True)


def test_allocation_list_entries_interpolation_and_distinct_hosts(nomad_lab, tmp_path):
    n = client(nomad_lab)
    out = tmp_path / "where"
    out.mkdir()
    spec = job_spec("where", 4, "/bin/sh", ["-c", (f"echo ${{node.unique.name}} ${{NOMAD_ALLOC_INDEX}} "
                                                   f"> {out}/$NOMAD_ALLOC_ID; exec sleep 300")])
    spec["Job"]["Constraints"] = [{"Operand": "distinct_hosts", "RTarget": "true"}]
    n.jobs.register_job(spec)
    wait_until(lambda: [s[1] for s in statuses(n, "where")] == ["running"] * 3)
    assert n.job.get_summary("where")["Summary"]["cache"]["Queued"] == 1  # three nodes, one allocation each
    stub = n.job.get_allocations("where")[0]
    assert set(stub) == {
        "ClientDescription", "ClientStatus", "CreateIndex", "CreateTime", "DeploymentStatus", "DesiredDescription",
        "DesiredStatus", "DesiredTransition", "EvalID", "FollowupEvalID", "ID", "JobID", "JobType", "JobVersion",
        "ModifyIndex", "ModifyTime", "Name", "Namespace", "NextAllocation", "NodeID", "NodeName",
        "PreemptedAllocations", "PreemptedByAllocation", "RescheduleTracker", "TaskGroup", "TaskStates"}
    assert set(stub["DesiredTransition"]) == {"ForceReschedule", "Migrate", "MigrateDisablePlacement",
                                              "NoShutdownDelay", "Reschedule"}
    full = n.allocation.get_allocation(stub["ID"])
    assert {"AllocatedResources", "DeploymentID", "Job"} <= set(full) and full["DeploymentID"]
    written = wait_until(lambda: sorted(texts) if len(texts := [p.read_text().split()[:1] for p in out.iterdir()]) == 3
                         and all(texts) else None)
    written = [t[0] for t in written]
    assert written == ["cache1", "cache2", "cache3"]
    n.job.deregister_job("where", purge=True)


def _gone_or_zombie(pid: int) -> bool:
    """The process has exited: reaped, or a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:  # gone, or reaped between opening its stat and reading it
        return True
