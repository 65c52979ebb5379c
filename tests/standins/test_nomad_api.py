"""Nomad stand-in exercised through python-nomad: jobs, evals, allocs, nodes, scheduler, raw_exec, metrics."""

from __future__ import annotations

import os

import nomad
import pytest
import requests
from nomad.api.exceptions import BaseNomadException, URLNotFoundNomadException
from prometheus_client.parser import text_string_to_metric_families

from .conftest import start_nomad, wait_until


def job_spec(job_id: str, count: int, command: str = "/bin/sleep", args=("300",), reschedule_delay_s: int = 5):
    return {"Job": {
        "ID": job_id, "Name": job_id, "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{
            "Name": "cache", "Count": count,
            "ReschedulePolicy": {"Delay": reschedule_delay_s * 10**9, "DelayFunction": "constant", "Unlimited": True},
            "Tasks": [{"Name": "redis", "Driver": "raw_exec",
                       "Config": {"command": command, "args": list(args)}, "KillTimeout": 2 * 10**9}],
        }],
    }}


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
    n.jobs.register_job(job_spec("svc", 1))
    wait_until(lambda: [s[1] for s in statuses(n, "svc")] == ["running"])
    resp = n.job.request("svc", "scale", method="post",
                         json={"Count": 3, "Target": {"Group": "cache"}, "Message": "drill"}).json()
    ev = n.evaluation.get_evaluation(resp["EvalID"])
    assert ev["TriggeredBy"] == "job-scaling"
    wait_until(lambda: [s[1] for s in statuses(n, "svc")] == ["running"] * 3)
    assert n.job.get_job("svc")["Version"] == 1
    assert n.job.request("svc", "scale", method="get").json()["TaskGroups"]["cache"]["Desired"] == 3
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
    n.jobs.register_job(job_spec("game", 3, reschedule_delay_s=5))
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
        ports = stub["AllocatedResources"]["Shared"]["Ports"]
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
