"""Nomad actions: scale a task group, quarantine nodes that look ready but fail, redeploy a job from scratch."""

from __future__ import annotations

import copy
import time
from typing import Any

import requests
from temporalio.exceptions import ApplicationError

from activities._clients import (
    CLIENT_ERRORS,
    bad,
    call,
    describe,
    heartbeat,
    nomad_client,
    resume_details,
    translate,
    unavailable,
)
from activities._nomad_checks import group_of as _group
from activities._nomad_checks import read_job as _job
from activities.binding import implements
from activities.contracts.nomad import (
    JOB_REDEPLOY_FROM_SCRATCH,
    JOBS_SCALE,
    NODES_QUARANTINE_UNHEALTHY,
    NODES_RESTORE_ELIGIBILITY,
    AllocView,
    NodeProbe,
    NodesEligibleInput,
    NodesEligibleOutput,
    NodeVerdict,
    QuarantineInput,
    QuarantineOutput,
    RedeployInput,
    RedeployOutput,
    ScaleInput,
    ScaleOutput,
)

__all__ = [
    "job_redeploy_from_scratch",
    "jobs_scale",
    "nodes_quarantine_unhealthy",
    "nodes_restore_eligibility",
    "read_group_count",
    "scale_group",
    "update_job",
    "wait_for_no_active_deployment",
]

ENFORCE_ATTEMPTS = 5
# Server-managed fields dropped from a job read back before it is registered again.
SERVER_FIELDS = ("Status", "StatusDescription", "Version", "JobModifyIndex", "ModifyIndex", "CreateIndex",
                 "SubmitTime", "Stable")


# --------------------------------------------------------------------------- scaling


def read_group_count(api: Any, job: str, group: str | None, namespace: str = "default") -> tuple[str, int]:
    """(group name, its count) as the job spec says."""
    tg = _group(_job(api, job, namespace), group)
    return tg["Name"], int(tg.get("Count") or 0)


ACTIVE_DEPLOYMENT = ("initializing", "pending", "running", "paused", "blocked", "unblocking")
SCALE_BLOCKED = "job scaling blocked due to active deployment"
DEPLOYMENT_POLL_S = 0.5


def _latest_deployment(api: Any, job: str, namespace: str) -> dict[str, Any] | None:
    """GET /v1/job/:id/deployment: the job's most recent deployment, or None (Nomad answers null)."""
    return call(f"read deployment of {job}", lambda: api.job.request(
        job, "deployment", method="get", params={"namespace": namespace}).json(), not_found=None) or None


def _needs_operator(dep: dict[str, Any]) -> str | None:
    """Why an active deployment cannot finish by itself (paused, or canaries waiting to be promoted), or None."""
    if dep.get("Status") == "paused":
        return "is paused"
    waiting = [name for name, g in (dep.get("TaskGroups") or {}).items()
               if g.get("DesiredCanaries") and not g.get("Promoted") and not g.get("AutoPromote")
               and len(g.get("PlacedCanaries") or []) >= g["DesiredCanaries"]
               and int(g.get("HealthyAllocs") or 0) >= g["DesiredCanaries"]]
    return f"waits for its canaries in {waiting} to be promoted" if waiting else None


def wait_for_no_active_deployment(api: Any, job: str, namespace: str = "default", timeout_s: float = 600.0) -> bool:
    """Block (heartbeating) while the job's latest deployment is still active; True if there was one to wait for.

    Real Nomad starts a deployment on every register or scale of a job with an update block (service
    and system jobs have one by default) and refuses to scale while it runs (HTTP 400 "job scaling
    blocked due to active deployment"). It ends on its own: successful once every allocation has been
    healthy for min_healthy_time, failed on an unhealthy one or at its progress deadline. One that
    needs an operator (paused, canaries to promote) is an error at once rather than a long wait.
    """
    deadline = time.monotonic() + timeout_s
    waited = False
    while True:
        dep = _latest_deployment(api, job, namespace)
        status = dep.get("Status") if dep is not None else None
        if dep is None or status not in ACTIVE_DEPLOYMENT:
            return waited
        label = f"{job}: deployment {dep['ID'][:8]} of version {dep.get('JobVersion')}"
        if why := _needs_operator(dep):
            raise unavailable(f"{label} {why}; resume, promote or fail it first", retryable=False)
        if time.monotonic() > deadline:
            raise unavailable(f"{label} still {status} after {timeout_s:.0f}s ({dep.get('StatusDescription', '')})")
        heartbeat({"waiting_for_deployment": dep["ID"], "job": job, "status": status})
        waited = True
        time.sleep(DEPLOYMENT_POLL_S)


def update_job(api: Any, job: str, namespace: str, mutate: Any,
               known: dict[str, Any] | None = None) -> tuple[dict[str, Any], bool]:
    """Re-register a job after `mutate(spec) -> bool` edits a copy of it (False: nothing to change).

    `known`: the job as the caller just read it, saving a read (the modify index it carries is enforced,
    so a stale one only costs a re-read). Waits out an active deployment before registering, then reads
    the job again, since the deployment's end may have changed it; on an index conflict it re-reads and
    asks `mutate` again. Reads the job back: `mutate` must then find nothing to change.
    Returns (the spec as it was before, changed).
    """
    for _ in range(ENFORCE_ATTEMPTS):
        before = known if known is not None else _job(api, job, namespace)
        known = None
        spec = copy.deepcopy(before)
        if not mutate(spec):
            return before, False  # nothing to do: no need to wait out a deployment to find that out
        if wait_for_no_active_deployment(api, job, namespace):
            continue
        for name in SERVER_FIELDS:
            spec.pop(name, None)
        body = {"Job": spec, "EnforceIndex": True, "JobModifyIndex": before["JobModifyIndex"]}
        try:
            api.job.request(job, method="post", json=body, params={"namespace": namespace})
        except CLIENT_ERRORS as exc:
            if "job modify index" in describe(exc).lower():
                continue
            raise translate(f"register {job}", exc) from None
        after = _job(api, job, namespace)
        if mutate(copy.deepcopy(after)):
            raise unavailable(f"registered {job} (version {after.get('Version')}), but it reads back without the change")
        return before, True
    raise unavailable(f"{job}: the job kept changing under us ({ENFORCE_ATTEMPTS} index conflicts or deployments)")


def scale_group(api: Any, job: str, group: str | None, namespace: str, count: int, message: str) -> tuple[int, bool]:
    """Set a task group's count with the job's modify index enforced; returns (previous count, changed).

    POST /v1/job/:id/scale through python-nomad's generic request (it has no scale wrapper). Nomad
    refuses to scale while a deployment of the job runs, so an active one is waited out (heartbeating)
    and the job read again. An index conflict means someone else changed the job: re-read and decide again.
    """
    for _ in range(ENFORCE_ATTEMPTS):
        spec = _job(api, job, namespace)
        tg = _group(spec, group)
        previous = int(tg.get("Count") or 0)
        if previous == count:
            return previous, False
        if wait_for_no_active_deployment(api, job, namespace):
            continue  # the job may have changed while its deployment ran: read it again
        body = {"Count": count, "Target": {"Group": tg["Name"]}, "Message": message,
                "EnforceIndex": True, "JobModifyIndex": spec["JobModifyIndex"]}
        try:
            api.job.request(job, "scale", method="post", json=body, params={"namespace": namespace})
        except CLIENT_ERRORS as exc:
            text = describe(exc).lower()
            if "job modify index" in text or SCALE_BLOCKED in text:
                continue  # someone changed the job, or a deployment began, since we read it
            raise translate(f"scale {job}/{tg['Name']}", exc) from None
        after = _group(_job(api, job, namespace), tg["Name"])
        if int(after.get("Count") or 0) != count:
            raise unavailable(f"scaled {job}/{tg['Name']} to {count} but it reads back {after.get('Count')}")
        return previous, True
    raise unavailable(f"{job}: the job kept changing under us ({ENFORCE_ATTEMPTS} attempts: index conflicts or "
                      "new deployments)")


@implements(JOBS_SCALE)
def jobs_scale(inp: ScaleInput) -> ScaleOutput:
    api = nomad_client(inp.nomad)
    group, _ = read_group_count(api, inp.job, inp.group, inp.namespace)
    previous, changed = scale_group(api, inp.job, group, inp.namespace, inp.count, inp.message)
    undo = inp.model_copy(update={"group": group, "count": previous, "message": "coldstart: undo scale"})
    return ScaleOutput(job=inp.job, group=group, previous_count=previous, count=inp.count, changed=changed, undo=undo)


# --------------------------------------------------------------------------- node quarantine


def _probe(probe: NodeProbe) -> str | None:
    try:
        resp = requests.get(probe.url, timeout=probe.timeout_seconds)
    except requests.RequestException as exc:
        return f"probe {probe.url} unreachable: {type(exc).__name__}"
    if resp.status_code not in probe.expect_status:
        return f"probe {probe.url} answered {resp.status_code}"
    return None


@implements(NODES_QUARANTINE_UNHEALTHY)
def nodes_quarantine_unhealthy(inp: QuarantineInput) -> QuarantineOutput:
    if not inp.probes and inp.failed_allocs_within_minutes is None:
        raise bad("give probes and/or failed_allocs_within_minutes: nothing to judge nodes by")
    api = nomad_client(inp.nomad)
    nodes = call("list nodes", lambda: api.nodes.get_nodes())
    by_ref = {n["Name"]: n for n in nodes} | {n["ID"]: n for n in nodes}
    unknown = [p.node for p in inp.probes if p.node not in by_ref]
    if unknown:
        raise bad(f"probes name unknown nodes: {unknown}")
    probes: dict[str, list[NodeProbe]] = {}
    for p in inp.probes:
        probes.setdefault(by_ref[p.node]["ID"], []).append(p)
    # A previous attempt's verdicts: nodes it already quarantined are ineligible now, so they
    # would be "skipped" and vanish from the undo unless carried over.
    prior = resume_details() or {}
    done = {v["node_id"]: NodeVerdict.model_validate(v) for v in prior.get("quarantined", [])}
    since_ns = (time.time() - inp.failed_allocs_within_minutes * 60) * 1e9 if inp.failed_allocs_within_minutes else None
    verdicts, healthy, skipped = [], [], []
    for node in sorted(nodes, key=lambda n: n["Name"]):
        if node["ID"] in done:
            continue
        if node["Status"] != "ready" or node["SchedulingEligibility"] != "eligible" or node.get("Drain"):
            skipped.append(node["Name"])
            continue
        reasons = [r for r in (_probe(p) for p in probes.get(node["ID"], [])) if r]
        if since_ns is not None:
            allocs = call(f"list allocations on {node['Name']}", lambda: api.node.get_allocations(node["ID"]))
            failed = [a for a in allocs if a.get("ClientStatus") == "failed" and int(a.get("ModifyTime") or 0) >= since_ns]
            if len(failed) >= inp.min_failed_allocs:
                reasons.append(f"{len(failed)} allocation(s) failed in the last {inp.failed_allocs_within_minutes:g} min")
        if reasons:
            verdicts.append(NodeVerdict(node_id=node["ID"], name=node["Name"], reasons=reasons))
        else:
            healthy.append(node["Name"])
    candidates = len(verdicts) + len(healthy)
    if verdicts and len(verdicts) > inp.max_fraction * candidates:
        raise ApplicationError(
            f"{len(verdicts)} of {candidates} ready nodes fail their probes, over max_fraction={inp.max_fraction}: "
            f"nothing changed (is the probe itself broken?): {[v.name for v in verdicts]}",
            type="TooMany", non_retryable=True)
    for v in verdicts:
        call(f"mark {v.name} ineligible", lambda: api.node.eligible_node(v.node_id, ineligible=True))
        done[v.node_id] = v
        heartbeat({"quarantined": [d.model_dump() for d in done.values()]})
    for v in done.values():
        now = call(f"read node {v.name}", lambda: api.node.get_node(v.node_id))
        if now["SchedulingEligibility"] != "ineligible":
            raise unavailable(f"marked {v.name} ineligible but it reads back {now['SchedulingEligibility']}")
    skipped = [s for s in skipped if s not in {d.name for d in done.values()}]
    ids = list(done)
    return QuarantineOutput(quarantined=list(done.values()), healthy=healthy, skipped=skipped,
                            undo=NodesEligibleInput(nomad=inp.nomad, node_ids=ids))


@implements(NODES_RESTORE_ELIGIBILITY)
def nodes_restore_eligibility(inp: NodesEligibleInput) -> NodesEligibleOutput:
    api = nomad_client(inp.nomad)
    made, unchanged = [], []
    for node_id in inp.node_ids:
        node = call(f"read node {node_id}", lambda: api.node.get_node(node_id))
        if node["SchedulingEligibility"] == "eligible":
            unchanged.append(node["Name"])
            continue
        call(f"mark {node['Name']} eligible", lambda: api.node.eligible_node(node_id, eligible=True))
        made.append(node["Name"])
    return NodesEligibleOutput(made_eligible=made, unchanged=unchanged)


# --------------------------------------------------------------------------- redeploy from scratch


def _clean(spec: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(spec)
    for name in SERVER_FIELDS:
        spec.pop(name, None)
    spec["Stop"] = False
    return spec


def _allocs(api: Any, job: str, namespace: str) -> list[dict[str, Any]]:
    """GET /v1/job/:id/allocations: list entries (no AllocatedResources; see _alloc)."""
    return call(f"list allocations of {job}", lambda: api.job.request(
        job, "allocations", method="get", params={"namespace": namespace}).json(), not_found=None) or []


def _alloc(api: Any, alloc_id: str) -> dict[str, Any]:
    """GET /v1/allocation/:id: the whole allocation, with AllocatedResources."""
    return call(f"read allocation {alloc_id}", lambda: api.allocation.get_allocation(alloc_id))


def _view(a: dict[str, Any]) -> AllocView:
    # AllocatedResources.Shared.Ports: https://developer.hashicorp.com/nomad/api-docs/allocations#read-allocation
    shared = (a.get("AllocatedResources") or {}).get("Shared") or {}
    ports = {p["Label"]: f"{p.get('HostIP') or '?'}:{p['Value']}" for p in shared.get("Ports") or [] if p.get("Label")}
    return AllocView(id=a["ID"], node=a.get("NodeName") or a.get("NodeID", ""), group=a["TaskGroup"],
                     status=a["ClientStatus"], ports=ports)


def _expected(api: Any, spec: dict[str, Any]) -> int:
    """Allocations a healthy job has: the group counts, or for a system job one per eligible ready node."""
    if spec.get("Type") != "system":
        return sum(int(g.get("Count") or 0) for g in spec["TaskGroups"])
    dcs = spec.get("Datacenters") or ["*"]
    pool = spec.get("NodePool") or "default"
    nodes = call("list nodes", lambda: api.nodes.get_nodes())
    fit = [n for n in nodes if n.get("Status") == "ready" and n.get("SchedulingEligibility") == "eligible"
           and not n.get("Drain") and ("*" in dcs or n.get("Datacenter") in dcs)
           and (pool == "all" or (n.get("NodePool") or "default") == pool)]
    return len(fit) * len(spec["TaskGroups"])


def _uses_deployments(spec: dict[str, Any]) -> bool:
    """Nomad rolls this job out with a deployment: a service or system job with a non-empty update block."""
    return spec.get("Type") in ("service", "system") and any(
        int((g.get("Update") or {}).get("MaxParallel") or 0) > 0 for g in spec["TaskGroups"])


def _healthy(a: dict[str, Any], deployed: bool) -> bool:
    if a.get("DesiredStatus") != "run" or a.get("ClientStatus") != "running":
        return False
    # Under a deployment, healthy is what the client reported (DeploymentStatus.Healthy, absent until
    # min_healthy_time has passed); without one, running is all there is.
    return not deployed or (a.get("DeploymentStatus") or {}).get("Healthy") is True


TERMINAL = ("complete", "failed", "lost")


def _stop_and_purge(api: Any, inp: RedeployInput, state: dict[str, Any]) -> None:
    """Stop the job (no purge), wait until every allocation is terminal on its client, then purge.

    A purge alone drops the allocations from the API at once while their tasks still run until their
    kill_timeout (longer for a task that ignores its kill signal), so nothing would show them gone.
    Resumable: a stopped job is not stopped again, a purged one is not there to purge.
    """
    current = _job_or_none(api, inp.job, inp.namespace)
    if current is None:
        return
    if not current.get("Stop"):
        call(f"stop {inp.job}", lambda: api.job.deregister_job(inp.job, purge=False, namespace=inp.namespace))
    deadline = time.monotonic() + inp.stop_timeout_seconds  # per attempt: a retry waits afresh
    while True:
        running = [a for a in _allocs(api, inp.job, inp.namespace) if a.get("ClientStatus") not in TERMINAL]
        if not running:
            break
        if time.monotonic() > deadline:
            raise unavailable(f"stopped {inp.job}, but {len(running)} allocation(s) still "
                              f"{sorted({str(a.get('ClientStatus')) for a in running})} after "
                              f"{inp.stop_timeout_seconds:.0f}s on {sorted({a.get('NodeName', '?') for a in running})};"
                              " not purged, a retry resumes here", details=state)
        heartbeat(state)
        time.sleep(inp.poll_seconds)
    try:
        call(f"purge {inp.job}", lambda: api.job.deregister_job(inp.job, purge=True, namespace=inp.namespace))
    except ApplicationError as exc:
        if exc.type != "NotFound":
            raise
    state["purged"] = True
    heartbeat(state)


def _job_or_none(api: Any, job: str, namespace: str) -> dict[str, Any] | None:
    try:
        return _job(api, job, namespace)
    except ApplicationError as exc:
        if exc.type == "NotFound":
            return None
        raise


def _deployment_of(api: Any, job: dict[str, Any], namespace: str) -> dict[str, Any] | None:
    """The deployment of exactly this registration (job create index and version), or None yet."""
    dep = _latest_deployment(api, job["ID"], namespace)
    if dep and dep.get("JobCreateIndex") == job.get("CreateIndex") and dep.get("JobVersion") == job.get("Version"):
        return dep
    return None


@implements(JOB_REDEPLOY_FROM_SCRATCH)
def job_redeploy_from_scratch(inp: RedeployInput) -> RedeployOutput:
    api = nomad_client(inp.nomad)
    state = resume_details() or {}
    if state.get("job") != inp.job:
        state = {"job": inp.job, "phase": "read", "t0": time.time()}
    if state["phase"] == "read":
        if inp.job_spec is not None:
            spec, source = inp.job_spec, "inline"
        else:
            recorded = _job_or_none(api, inp.job, inp.namespace)
            if recorded is None:
                raise bad(f"job {inp.job} does not exist and no job_spec was given")
            spec, source = recorded, "recorded"
        spec = _clean(spec)
        if spec.get("ID") != inp.job:
            raise bad(f"job_spec ID {spec.get('ID')!r} is not {inp.job!r}")
        spec.setdefault("Namespace", inp.namespace)
        state.update(phase="stop", spec=spec, source=source)
        heartbeat(state)
    spec, source = state["spec"], state["source"]
    stop_started = time.monotonic()
    if state["phase"] == "stop":
        _stop_and_purge(api, inp, state)
        state["phase"] = "register"
        heartbeat(state)
    stop_seconds = round(time.monotonic() - stop_started, 3)
    if state["phase"] == "register":
        resp = call(f"register {inp.job}", lambda: api.job.register_job(inp.job, {"Job": spec}))
        state.update(phase="wait", index=int(resp.get("JobModifyIndex") or 0), t_register=time.time())
        heartbeat(state)
    registered = _job(api, inp.job, inp.namespace)
    expected = _expected(api, registered)
    if expected == 0:
        raise ApplicationError(f"{inp.job} is registered but no node can take it (no eligible ready node in its "
                               "datacenters and node pool)", type="NoCapacity", non_retryable=True)
    deployed = _uses_deployments(registered)
    wait_started = time.monotonic()
    deadline = state.get("t_register", time.time()) + inp.deadline_seconds
    while True:
        live = [a for a in _allocs(api, inp.job, inp.namespace) if a.get("DesiredStatus") == "run"]
        healthy = [a for a in live if _healthy(a, deployed)]
        failed = [a for a in live if a.get("ClientStatus") == "failed"]
        dep = _deployment_of(api, registered, inp.namespace) if deployed else None
        state["progress"] = {"healthy": len(healthy), "expected": expected, "failed": len(failed),
                             "deployment": (dep or {}).get("Status")}
        heartbeat(state)
        if dep is not None and dep["Status"] in ("failed", "cancelled"):
            raise ApplicationError(
                f"{inp.job} registered, but its deployment {dep['ID'][:8]} {dep['Status']}: "
                f"{dep.get('StatusDescription', '')} ({len(healthy)}/{expected} healthy); the job stays registered",
                {"deployment": dep["ID"], "failed": [_view(a).model_dump() for a in failed]},
                type="DeploymentFailed", non_retryable=True)
        if len(healthy) >= expected and (not deployed or (dep is not None and dep["Status"] == "successful")):
            break
        if time.time() > deadline:
            raise ApplicationError(
                f"{inp.job} registered, but only {len(healthy)}/{expected} allocations healthy after "
                f"{inp.deadline_seconds:.0f}s ({len(failed)} failed on "
                f"{sorted({a.get('NodeName', '?') for a in failed})}); the job stays registered",
                {"healthy": [a["ID"] for a in healthy], "failed": [_view(a).model_dump() for a in failed]},
                type="DeadlineExceeded", non_retryable=True)
        time.sleep(inp.poll_seconds)
    # List entries carry no AllocatedResources: read each allocation for its ports.
    views = [_view(_alloc(api, a["ID"])) for a in healthy] if inp.port_label else [_view(a) for a in healthy]
    endpoints = [v.ports[inp.port_label] for v in views if inp.port_label in v.ports] if inp.port_label else []
    if inp.port_label and not endpoints:
        raise bad(f"{inp.job} redeployed and healthy, but no allocation has a port labelled {inp.port_label!r}")
    return RedeployOutput(job=inp.job, spec_source=source, purged=bool(state.get("purged")),
                          job_modify_index=int(state.get("index", 0)), allocations=views, expected=expected,
                          stop_seconds=stop_seconds, deploy_seconds=round(time.monotonic() - wait_started, 3),
                          failed_allocations=[_view(a) for a in failed], endpoints=endpoints)
