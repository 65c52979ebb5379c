"""Nomad HTTP API stand-in: jobs, deployments, evaluations, allocations, nodes, a spread scheduler and raw_exec tasks."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from .listeners import LABEL, ListenSpec, bind_socket, serve_forever
from .nomad_model import NOMAD_VERSION, NomadError, eval_view, public
from .nomad_state import NomadState
from .promtext import Series, render

__all__ = ["STATE", "make_app", "parse_node", "run"]

STATE = web.AppKey("nomad_state", NomadState)
RPC_ADDR = web.AppKey("rpc_addr", str)


def _state(request: web.Request) -> NomadState:
    return request.app[STATE]


def _meta(request: web.Request) -> dict[str, str]:
    return {"X-Nomad-Index": str(_state(request).index), "X-Nomad-KnownLeader": "true", "X-Nomad-LastContact": "0"}


def _json(request: web.Request, data: Any, status: int = 200, meta: str = "query") -> web.Response:
    """`meta`: "query" (reads: index, leader, contact headers), "write" (the index only) or "none"
    (agent-local answers: status, agent self, metrics), as Nomad sets them."""
    headers = {"query": _meta(request), "write": {"X-Nomad-Index": str(_state(request).index)}}.get(meta, {})
    return web.Response(status=status, text=json.dumps(data), content_type="application/json", headers=headers)


def _write(request: web.Request, data: Any) -> web.Response:
    return _json(request, data, meta="write")


def _ns(request: web.Request) -> str:
    return request.query.get("namespace") or "default"


def _truthy(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("1", "true", "t", "yes")


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw:
        raise NomadError(400, "Request body is empty")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise NomadError(400, f"failed to decode request body: {exc}") from exc
    if not isinstance(data, dict):
        raise NomadError(400, "failed to decode request body: expected an object")
    return data


@web.middleware
async def nomad_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except NomadError as exc:  # Nomad replies with the error text as a plain body (reads: with query meta)
        return web.Response(status=exc.status, text=str(exc), headers=_meta(request) if request.method == "GET" else {})


# ---- jobs ----------------------------------------------------------------------------------
async def jobs_list(request: web.Request) -> web.Response:
    """GET /v1/jobs[?prefix=&namespace=] -- https://developer.hashicorp.com/nomad/api-docs/jobs#list-jobs"""
    st = _state(request)
    ns, prefix = _ns(request), request.query.get("prefix", "")
    jobs = [j for j in st.jobs.values() if (ns == "*" or j["Namespace"] == ns) and j["ID"].startswith(prefix)]
    return _json(request, [st.job_stub(j) for j in sorted(jobs, key=lambda j: j["ID"])])


async def _register(request: web.Request, path_id: str | None) -> web.Response:
    body = await _body(request)
    job = body.get("Job")
    if not job:
        raise NomadError(400, "Job must be specified")
    if path_id is not None and job.get("ID") != path_id:
        raise NomadError(400, "Job ID does not match name")
    resp = _state(request).register(
        job, enforce=bool(body.get("EnforceIndex")), modify_index=int(body.get("JobModifyIndex") or 0)
    )
    return _write(request, dict(resp, LastContact=0, KnownLeader=True, NextToken=""))


async def jobs_register(request: web.Request) -> web.Response:
    """POST /v1/jobs {"Job", "EnforceIndex", "JobModifyIndex"} -- https://developer.hashicorp.com/nomad/api-docs/jobs#create-job"""
    return await _register(request, None)


async def job_register(request: web.Request) -> web.Response:
    """POST /v1/job/:job_id {"Job", ...} -- https://developer.hashicorp.com/nomad/api-docs/jobs#update-existing-job"""
    return await _register(request, request.match_info["job_id"])


async def job_read(request: web.Request) -> web.Response:
    """GET /v1/job/:job_id -- https://developer.hashicorp.com/nomad/api-docs/jobs#read-job"""
    return _json(request, _state(request).get_job(_ns(request), request.match_info["job_id"]))


async def job_stop(request: web.Request) -> web.Response:
    """DELETE /v1/job/:job_id[?purge=true] -- https://developer.hashicorp.com/nomad/api-docs/jobs#stop-a-job"""
    resp = _state(request).deregister(_ns(request), request.match_info["job_id"], _truthy(request, "purge"))
    return _write(request, dict(resp, LastContact=0, KnownLeader=True, NextToken=""))


async def job_versions(request: web.Request) -> web.Response:
    """GET /v1/job/:job_id/versions -- https://developer.hashicorp.com/nomad/api-docs/jobs#list-job-versions"""
    st = _state(request)
    key = st.key(_ns(request), request.match_info["job_id"])
    if key not in st.jobs:
        raise NomadError(404, "job versions not found")
    return _json(request, {"Versions": [st.job_view(v) for v in st.versions.get(key, [])], "Diffs": None,
                           "Index": st.index, "KnownLeader": True, "LastContact": 0, "NextToken": ""})


async def job_allocations(request: web.Request) -> web.Response:
    """GET /v1/job/:job_id/allocations[?all=] -- https://developer.hashicorp.com/nomad/api-docs/jobs#list-job-allocations"""
    st = _state(request)
    allocs = [a for a in st.allocs.values()
              if a["JobID"] == request.match_info["job_id"] and a["Namespace"] == _ns(request)]
    return _json(request, [st.alloc_stub(a) for a in sorted(allocs, key=lambda a: a["CreateIndex"])])


async def job_evaluations(request: web.Request) -> web.Response:
    """GET /v1/job/:job_id/evaluations -- https://developer.hashicorp.com/nomad/api-docs/jobs#list-job-evaluations"""
    st = _state(request)
    evs = [eval_view(e) for e in st.evals.values()
           if e["JobID"] == request.match_info["job_id"] and e["Namespace"] == _ns(request)]
    return _json(request, sorted(evs, key=lambda e: e["CreateIndex"], reverse=True))


async def job_summary(request: web.Request) -> web.Response:
    """GET /v1/job/:job_id/summary -- https://developer.hashicorp.com/nomad/api-docs/jobs#read-job-summary"""
    return _json(request, _state(request).summary(_ns(request), request.match_info["job_id"]))


async def job_scale(request: web.Request) -> web.Response:
    """POST /v1/job/:job_id/scale {"Count", "Target": {"Group"}, ...} -- https://developer.hashicorp.com/nomad/api-docs/jobs#scale-task-group"""
    body = await _body(request)
    resp = _state(request).scale(_ns(request), request.match_info["job_id"], body)
    return _write(request, dict(resp, LastContact=0, KnownLeader=True, NextToken=""))


async def job_scale_status(request: web.Request) -> web.Response:
    """GET /v1/job/:job_id/scale -- https://developer.hashicorp.com/nomad/api-docs/jobs#read-job-scale-status"""
    return _json(request, _state(request).scale_status(_ns(request), request.match_info["job_id"]))


async def job_deployment(request: web.Request) -> web.Response:
    """GET /v1/job/:job_id/deployment -- the latest deployment, or null -- https://developer.hashicorp.com/nomad/api-docs/jobs#read-job-39-s-most-recent-deployment"""
    dep = _state(request).latest_deployment(_ns(request), request.match_info["job_id"])
    return _json(request, public(dep) if dep else None)


async def job_deployments(request: web.Request) -> web.Response:
    """GET /v1/job/:job_id/deployments -- newest first -- https://developer.hashicorp.com/nomad/api-docs/jobs#list-job-deployments"""
    st = _state(request)
    return _json(request, [public(d) for d in st._deployments_of(_ns(request), request.match_info["job_id"])])


# ---- deployments -----------------------------------------------------------------------------
async def deployments_list(request: web.Request) -> web.Response:
    """GET /v1/deployments[?prefix=] -- https://developer.hashicorp.com/nomad/api-docs/deployments#list-deployments"""
    st = _state(request)
    prefix, ns = request.query.get("prefix", ""), _ns(request)
    deps = [public(d) for d in st.deployments.values()
            if d["ID"].startswith(prefix) and (ns == "*" or d["Namespace"] == ns)]
    return _json(request, sorted(deps, key=lambda d: d["CreateIndex"], reverse=True))


async def deployment_read(request: web.Request) -> web.Response:
    """GET /v1/deployment/:deployment_id -- https://developer.hashicorp.com/nomad/api-docs/deployments#read-deployment"""
    return _json(request, public(_state(request).deployment(request.match_info["deployment_id"])))


async def deployment_allocations(request: web.Request) -> web.Response:
    """GET /v1/deployment/allocations/:deployment_id -- https://developer.hashicorp.com/nomad/api-docs/deployments#list-allocations-for-deployment"""
    st = _state(request)
    dep = st.deployment(request.match_info["deployment_id"])
    allocs = [a for a in st.allocs.values() if a.get("DeploymentID") == dep["ID"]]
    return _json(request, [st.alloc_stub(a) for a in sorted(allocs, key=lambda a: a["CreateIndex"])])


def _deployment_rpc(call, *args: Any) -> dict[str, Any]:
    try:
        return call(*args)
    except NomadError as exc:  # an unknown deployment is an RPC error here, not a read's 404
        raise NomadError(500 if exc.status == 404 else exc.status, str(exc)) from None


async def deployment_pause(request: web.Request) -> web.Response:
    """POST /v1/deployment/pause/:deployment_id {"DeploymentID", "Pause"} -- https://developer.hashicorp.com/nomad/api-docs/deployments#pause-deployment"""
    body = await _body(request)
    dep_id = request.match_info["deployment_id"]
    if not body.get("DeploymentID"):
        raise NomadError(400, "DeploymentID must be specified")
    if body["DeploymentID"] != dep_id:
        raise NomadError(400, "Deployment ID does not match")
    return _write(request, _deployment_rpc(_state(request).pause_deployment, dep_id, bool(body.get("Pause"))))


async def deployment_fail(request: web.Request) -> web.Response:
    """POST /v1/deployment/fail/:deployment_id -- https://developer.hashicorp.com/nomad/api-docs/deployments#fail-deployment"""
    return _write(request, _deployment_rpc(_state(request).fail_deployment, request.match_info["deployment_id"]))


# ---- allocations -----------------------------------------------------------------------------
async def allocations_list(request: web.Request) -> web.Response:
    """GET /v1/allocations[?prefix=] -- https://developer.hashicorp.com/nomad/api-docs/allocations#list-allocations"""
    st = _state(request)
    prefix, ns = request.query.get("prefix", ""), _ns(request)
    allocs = [a for a in st.allocs.values() if a["ID"].startswith(prefix) and (ns == "*" or a["Namespace"] == ns)]
    return _json(request, [st.alloc_stub(a) for a in sorted(allocs, key=lambda a: a["CreateIndex"])])


async def allocation_read(request: web.Request) -> web.Response:
    """GET /v1/allocation/:alloc_id -- https://developer.hashicorp.com/nomad/api-docs/allocations#read-allocation"""
    st = _state(request)
    return _json(request, st.alloc_full(st.alloc(request.match_info["alloc_id"])))


async def allocation_stop(request: web.Request) -> web.Response:
    """POST /v1/allocation/:alloc_id/stop -- https://developer.hashicorp.com/nomad/api-docs/allocations#stop-allocation"""
    return _write(request, _state(request).stop_alloc(request.match_info["alloc_id"]))


# ---- nodes ---------------------------------------------------------------------------------------
async def nodes_list(request: web.Request) -> web.Response:
    """GET /v1/nodes[?prefix=] -- https://developer.hashicorp.com/nomad/api-docs/nodes#list-nodes"""
    st = _state(request)
    prefix = request.query.get("prefix", "")
    nodes = [n for n in st.nodes.values() if n["ID"].startswith(prefix)]
    return _json(request, [st.node_stub(n) for n in sorted(nodes, key=lambda n: n["Name"])])


async def node_read(request: web.Request) -> web.Response:
    """GET /v1/node/:node_id -- https://developer.hashicorp.com/nomad/api-docs/nodes#read-node"""
    return _json(request, _state(request).node(request.match_info["node_id"]))


async def node_allocations(request: web.Request) -> web.Response:
    """GET /v1/node/:node_id/allocations -- https://developer.hashicorp.com/nomad/api-docs/nodes#list-node-allocations"""
    st = _state(request)
    node = st.node(request.match_info["node_id"])
    return _json(request, [st.alloc_full(a) for a in st.allocs.values() if a["NodeID"] == node["ID"]])


async def node_eligibility(request: web.Request) -> web.Response:
    """POST /v1/node/:node_id/eligibility {"Eligibility"} -- https://developer.hashicorp.com/nomad/api-docs/nodes#toggle-node-eligibility"""
    body = await _body(request)
    resp = _state(request).set_eligibility(request.match_info["node_id"], body.get("Eligibility", ""))
    return _write(request, dict(resp, EvalIDs=resp["EvalIDs"] or None, Index=_state(request).index))


async def node_drain(request: web.Request) -> web.Response:
    """POST /v1/node/:node_id/drain {"DrainSpec", "MarkEligible", "Meta"} -- https://developer.hashicorp.com/nomad/api-docs/nodes#drain-node"""
    body = await _body(request)
    resp = _state(request).drain(
        request.match_info["node_id"], body.get("DrainSpec"), bool(body.get("MarkEligible")), body.get("Meta")
    )
    return _write(request, dict(resp, EvalIDs=resp["EvalIDs"] or None, Index=_state(request).index))


# ---- evaluations ----------------------------------------------------------------------------------
async def evaluations_list(request: web.Request) -> web.Response:
    """GET /v1/evaluations[?prefix=] -- https://developer.hashicorp.com/nomad/api-docs/evaluations#list-evaluations"""
    st = _state(request)
    prefix, ns = request.query.get("prefix", ""), _ns(request)
    evs = [eval_view(e) for e in st.evals.values() if e["ID"].startswith(prefix) and (ns == "*" or e["Namespace"] == ns)]
    return _json(request, sorted(evs, key=lambda e: e["CreateIndex"], reverse=True))


def _find_eval(st: NomadState, eval_id: str) -> dict[str, Any]:
    ev = st.evals.get(eval_id)
    if ev is None:
        raise NomadError(404, "eval not found")
    return ev


async def evaluation_read(request: web.Request) -> web.Response:
    """GET /v1/evaluation/:eval_id -- https://developer.hashicorp.com/nomad/api-docs/evaluations#read-evaluation"""
    return _json(request, eval_view(_find_eval(_state(request), request.match_info["eval_id"])))


async def evaluation_allocations(request: web.Request) -> web.Response:
    """GET /v1/evaluation/:eval_id/allocations -- https://developer.hashicorp.com/nomad/api-docs/evaluations#list-allocations-for-evaluation"""
    st = _state(request)
    ev = _find_eval(st, request.match_info["eval_id"])
    return _json(request, [st.alloc_stub(a) for a in st.allocs.values() if a["EvalID"] == ev["ID"]])


# ---- status / agent / metrics -------------------------------------------------------------------------
async def status_leader(request: web.Request) -> web.Response:
    """GET /v1/status/leader -- https://developer.hashicorp.com/nomad/api-docs/status#read-leader"""
    return _json(request, request.app[RPC_ADDR], meta="none")


async def agent_self(request: web.Request) -> web.Response:
    """GET /v1/agent/self (abridged) -- https://developer.hashicorp.com/nomad/api-docs/agent#query-self"""
    st = _state(request)
    return _json(request, {
        "config": {"Datacenter": st.datacenter, "Region": st.region, "Version": {"Version": NOMAD_VERSION},
                   "Server": {"Enabled": True}, "Client": {"Enabled": True}},
        "member": {"Name": "nomad-standin", "Addr": request.app[RPC_ADDR].split(":")[0], "Status": "alive",
                   "Tags": {"region": st.region, "dc": st.datacenter, "role": "nomad", "build": NOMAD_VERSION}},
        "stats": {"nomad": {"leader": "true", "server": "true", "known_regions": "1"}},
    }, meta="none")


def _metric_series(st: NomadState) -> list[Series]:
    out: list[Series] = []
    counts = st.node_counts()
    for nid, node in sorted(st.nodes.items(), key=lambda kv: kv[1]["Name"]):
        labels = {
            "datacenter": node["Datacenter"], "host": node["Name"], "node_class": node["NodeClass"] or "none",
            "node_id": nid, "node_pool": node["NodePool"],
            "node_scheduling_eligibility": node["SchedulingEligibility"], "node_status": node["Status"],
        }
        for what in ("running", "failed", "pending", "terminal"):
            out.append(Series(f"nomad_client_allocations_{what}", "gauge", float(counts[nid][what]), labels))
    for job in sorted(st.jobs.values(), key=lambda j: j["ID"]):
        summary = st.summary(job["Namespace"], job["ID"])["Summary"]
        for tg, s in summary.items():
            # Nomad labels these `job`; Prometheus renames it exported_job at scrape time.
            labels = {"job": job["ID"], "namespace": job["Namespace"], "task_group": tg, "parent_id": job["ParentID"]}
            for what in ("running", "failed", "queued", "starting", "complete", "lost", "unknown"):
                out.append(Series(f"nomad_nomad_job_summary_{what}", "gauge", float(s[what.capitalize()]), labels))
    return out


async def metrics(request: web.Request) -> web.Response:
    """GET /v1/metrics[?format=prometheus] -- https://developer.hashicorp.com/nomad/api-docs/metrics"""
    st = _state(request)
    series = _metric_series(st)
    if request.query.get("format") == "prometheus":
        return web.Response(text=render(series), content_type="text/plain", charset="utf-8")
    gauges = [{"Name": s.name.replace("nomad_client_allocations_", "nomad.client.allocations.")
               .replace("nomad_nomad_job_summary_", "nomad.nomad.job_summary."), "Value": s.value,
               "Labels": dict(s.labels)} for s in series]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", time.gmtime(st.clock.time()))
    return _json(request, {"Timestamp": stamp, "Gauges": gauges, "Counters": [], "Samples": [], "Points": [],
                           "PrecisionGauges": []}, meta="none")


# ---- lab fault injection (NOT part of the Nomad API) ---------------------------------------------------
async def lab_faults_get(request: web.Request) -> web.Response:
    """GET /_lab/faults -- lab-only view of injected faults."""
    st = _state(request)
    return _json(request, {"unhealthy_nodes": sorted(st.nodes[n]["Name"] for n in st.unhealthy)})


async def lab_faults_post(request: web.Request) -> web.Response:
    """POST /_lab/faults {"fault": "unhealthy-node-eligible", "node": NAME} | {"fault": "clear"} -- lab-only."""
    st = _state(request)
    body = await _body(request)
    if body.get("fault") == "unhealthy-node-eligible":
        st.fault_unhealthy(str(body.get("node", "")))
    elif body.get("fault") == "clear":
        st.clear_faults()
    else:
        raise NomadError(400, f"unknown fault {body.get('fault')!r}")
    return await lab_faults_get(request)


async def lab_faults_delete(request: web.Request) -> web.Response:
    """DELETE /_lab/faults -- lab-only: clear faults."""
    _state(request).clear_faults()
    return await lab_faults_get(request)


async def housekeeping(st: NomadState, period: float = 1.0) -> None:
    while True:
        await asyncio.sleep(period)
        st.tick()
        st.save_state()


def make_app(st: NomadState, rpc_addr: str = "127.0.0.1:4647", run_housekeeping: bool = True) -> web.Application:
    app = web.Application(middlewares=[nomad_middleware])
    app[STATE] = st
    app[RPC_ADDR] = rpc_addr
    app[LABEL] = "nomad"
    r = app.router
    r.add_get("/v1/jobs", jobs_list)
    r.add_post("/v1/jobs", jobs_register)
    r.add_put("/v1/jobs", jobs_register)
    r.add_get("/v1/job/{job_id}", job_read)
    r.add_post("/v1/job/{job_id}", job_register)
    r.add_put("/v1/job/{job_id}", job_register)
    r.add_delete("/v1/job/{job_id}", job_stop)
    r.add_get("/v1/job/{job_id}/versions", job_versions)
    r.add_get("/v1/job/{job_id}/allocations", job_allocations)
    r.add_get("/v1/job/{job_id}/evaluations", job_evaluations)
    r.add_get("/v1/job/{job_id}/summary", job_summary)
    r.add_get("/v1/job/{job_id}/scale", job_scale_status)
    r.add_post("/v1/job/{job_id}/scale", job_scale)
    r.add_put("/v1/job/{job_id}/scale", job_scale)
    r.add_get("/v1/job/{job_id}/deployment", job_deployment)
    r.add_get("/v1/job/{job_id}/deployments", job_deployments)
    r.add_get("/v1/deployments", deployments_list)
    r.add_get("/v1/deployment/allocations/{deployment_id}", deployment_allocations)
    r.add_post("/v1/deployment/fail/{deployment_id}", deployment_fail)
    r.add_post("/v1/deployment/pause/{deployment_id}", deployment_pause)
    r.add_put("/v1/deployment/pause/{deployment_id}", deployment_pause)
    r.add_put("/v1/deployment/fail/{deployment_id}", deployment_fail)
    r.add_get("/v1/deployment/{deployment_id}", deployment_read)
    r.add_get("/v1/allocations", allocations_list)
    r.add_get("/v1/allocation/{alloc_id}", allocation_read)
    r.add_post("/v1/allocation/{alloc_id}/stop", allocation_stop)
    r.add_put("/v1/allocation/{alloc_id}/stop", allocation_stop)
    r.add_get("/v1/nodes", nodes_list)
    r.add_get("/v1/node/{node_id}", node_read)
    r.add_get("/v1/node/{node_id}/allocations", node_allocations)
    r.add_post("/v1/node/{node_id}/eligibility", node_eligibility)
    r.add_put("/v1/node/{node_id}/eligibility", node_eligibility)
    r.add_post("/v1/node/{node_id}/drain", node_drain)
    r.add_put("/v1/node/{node_id}/drain", node_drain)
    r.add_get("/v1/evaluations", evaluations_list)
    r.add_get("/v1/evaluation/{eval_id}", evaluation_read)
    r.add_get("/v1/evaluation/{eval_id}/allocations", evaluation_allocations)
    r.add_get("/v1/status/leader", status_leader)
    r.add_get("/v1/agent/self", agent_self)
    r.add_get("/v1/metrics", metrics)
    r.add_get("/_lab/faults", lab_faults_get)
    r.add_post("/_lab/faults", lab_faults_post)
    r.add_delete("/_lab/faults", lab_faults_delete)

    async def _ctx(app: web.Application):
        st.restore_tasks()
        task = asyncio.create_task(housekeeping(st)) if run_housekeeping else None
        yield
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        await st.shutdown()

    app.cleanup_ctx.append(_ctx)
    return app


def parse_node(text: str) -> dict[str, Any]:
    """NAME[:key=value,...]; keys class, dc, pool, address set node fields, others go to Meta."""
    name, _, rest = text.partition(":")
    spec: dict[str, Any] = {"name": name, "meta": {}}
    for item in filter(None, rest.split(",")):
        k, _, v = item.partition("=")
        if k in ("class", "dc", "pool", "address"):
            spec[k] = v
        else:
            spec["meta"][k] = v
    return spec


def run(listen: list[ListenSpec], nodes: list[dict[str, Any]], *, datacenter: str = "dc1", region: str = "global",
        state_dir: Path | None = None) -> None:
    """Serve on every `listen` address until SIGTERM; `nodes` as parse_node gives them, default client1..3."""
    nodes = nodes or [{"name": f"client{i}", "meta": {}} for i in (1, 2, 3)]
    first = listen[0]
    st = NomadState(nodes, datacenter=datacenter, region=region, state_dir=state_dir,
                    http_addr=f"{first.host}:{first.port}")
    socks = [bind_socket(spec) for spec in listen]
    rpc = f"{first.host}:4647"
    apps = [(make_app(st, rpc, run_housekeeping=(i == 0)), s) for i, s in enumerate(socks)]
    asyncio.run(serve_forever(apps))
